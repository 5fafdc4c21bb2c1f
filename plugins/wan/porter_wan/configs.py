"""Official Wan model configurations (public facts from the published
``config.json`` files), so real-size recipes can be validated and planned
without downloading weights.

Each entry: component -> (library, class name, constructor arguments).
"""

from __future__ import annotations

UMT5_XXL = ("transformers", "UMT5EncoderModel", {
    "vocab_size": 256384, "d_model": 4096, "d_kv": 64, "d_ff": 10240, "num_layers": 24,
    "num_heads": 64, "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128, "feed_forward_proj": "gated-gelu",
    "dense_act_fn": "gelu_new", "is_gated_act": True, "tie_word_embeddings": False})

WAN_VAE = ("diffusers", "AutoencoderKLWan", {
    "base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
    "attn_scales": [], "temperal_downsample": [False, True, True], "dropout": 0.0})


def _transformer(heads: int, ffn: int, layers: int, **extra):
    return ("diffusers", "WanTransformer3DModel", {
        "patch_size": [1, 2, 2], "num_attention_heads": heads, "attention_head_dim": 128,
        "in_channels": 16, "out_channels": 16, "text_dim": 4096, "freq_dim": 256,
        "ffn_dim": ffn, "num_layers": layers, "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "rope_max_seq_len": 1024, **extra})


WAN_1_3B = _transformer(12, 8960, 30)
WAN_14B = _transformer(40, 13824, 40)
WAN_I2V_14B = _transformer(40, 13824, 40, in_channels=36, image_dim=1280,
                           added_kv_proj_dim=5120)

CLIP_VIT_H = ("transformers", "CLIPVisionModelWithProjection", {
    "hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32,
    "num_attention_heads": 16, "image_size": 224, "patch_size": 14, "projection_dim": 1024,
    "hidden_act": "gelu"})

OFFICIAL = {
    "Wan-AI/Wan2.1-T2V-1.3B-Diffusers": {
        "transformer": WAN_1_3B, "text_encoder": UMT5_XXL, "vae": WAN_VAE},
    "Wan-AI/Wan2.1-T2V-14B-Diffusers": {
        "transformer": WAN_14B, "text_encoder": UMT5_XXL, "vae": WAN_VAE},
    "Wan-AI/Wan2.2-T2V-A14B-Diffusers": {
        "transformer": WAN_14B, "transformer_2": WAN_14B, "text_encoder": UMT5_XXL,
        "vae": WAN_VAE},
    "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers": {
        "transformer": WAN_I2V_14B, "text_encoder": UMT5_XXL, "vae": WAN_VAE,
        "image_encoder": CLIP_VIT_H},
    "Wan-AI/Wan2.1-I2V-14B-720P-Diffusers": {
        "transformer": WAN_I2V_14B, "text_encoder": UMT5_XXL, "vae": WAN_VAE,
        "image_encoder": CLIP_VIT_H},
}
