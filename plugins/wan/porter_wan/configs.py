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


# Wan 2.2's own VAE (TI2V-5B): 48 latent channels, 16x spatial compression (2x2 pixel
# patches in, 12 channels), with its own latent statistics.
WAN22_VAE = ("diffusers", "AutoencoderKLWan", {
    "base_dim": 160, "decoder_base_dim": 256, "z_dim": 48, "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2, "attn_scales": [], "temperal_downsample": [False, True, True],
    "dropout": 0.0, "is_residual": True, "in_channels": 12, "out_channels": 12,
    "patch_size": 2, "scale_factor_spatial": 16, "scale_factor_temporal": 4,
    "latents_mean": [
        -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557,
        -0.1382, 0.0542, 0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825,
        -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
        -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230,
        -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
        0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667],
    "latents_std": [
        0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013,
        0.8158, 1.0344, 0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978,
        0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
        0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093,
        0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
        0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744]})


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
# first-last-frame: two CLIP images, 257 tokens each, with their own position embedding
WAN_FLF2V_14B = _transformer(40, 13824, 40, in_channels=36, image_dim=1280,
                             added_kv_proj_dim=5120, pos_embed_seq_len=514)
# Wan 2.2 image-to-video A14B: the first frame enters as latents only (no CLIP)
WAN22_I2V_14B = _transformer(40, 13824, 40, in_channels=36)
WAN22_TI2V_5B = _transformer(24, 14336, 30, in_channels=48, out_channels=48)

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
    "Wan-AI/Wan2.1-FLF2V-14B-720P-diffusers": {
        "transformer": WAN_FLF2V_14B, "text_encoder": UMT5_XXL, "vae": WAN_VAE,
        "image_encoder": CLIP_VIT_H},
    "Wan-AI/Wan2.2-I2V-A14B-Diffusers": {
        "transformer": WAN22_I2V_14B, "transformer_2": WAN22_I2V_14B,
        "text_encoder": UMT5_XXL, "vae": WAN_VAE},
    "Wan-AI/Wan2.2-TI2V-5B-Diffusers": {
        "transformer": WAN22_TI2V_5B, "text_encoder": UMT5_XXL, "vae": WAN22_VAE},
}

# The pipelines' own settings (model_index.json) for the hub ids above that have any.
PIPELINE = {
    "Wan-AI/Wan2.2-T2V-A14B-Diffusers": {"boundary_ratio": 0.875},
    "Wan-AI/Wan2.2-I2V-A14B-Diffusers": {"boundary_ratio": 0.9},
    "Wan-AI/Wan2.2-TI2V-5B-Diffusers": {"expand_timesteps": True},
}
