"""Official CogVideoX configurations (from the published config.json files), so
real-size recipes validate and plan without weights. Component -> (library,
class, constructor arguments)."""

from __future__ import annotations

T5_XXL = ("transformers", "T5EncoderModel", {
    "vocab_size": 32128, "d_model": 4096, "d_kv": 64, "d_ff": 10240, "num_layers": 24,
    "num_heads": 64, "relative_attention_num_buckets": 32, "feed_forward_proj": "gated-gelu",
    "dense_act_fn": "gelu_new", "is_gated_act": True, "tie_word_embeddings": False})

VAE = ("diffusers", "AutoencoderKLCogVideoX", {
    "in_channels": 3, "out_channels": 3, "latent_channels": 16,
    "block_out_channels": [128, 256, 256, 512], "layers_per_block": 3,
    "down_block_types": ["CogVideoXDownBlock3D"] * 4,
    "up_block_types": ["CogVideoXUpBlock3D"] * 4, "norm_num_groups": 32,
    "temporal_compression_ratio": 4})


def _transformer(heads: int, layers: int, **extra):
    return ("diffusers", "CogVideoXTransformer3DModel", {
        "num_attention_heads": heads, "attention_head_dim": 64, "in_channels": 16,
        "out_channels": 16, "time_embed_dim": 512, "text_embed_dim": 4096,
        "num_layers": layers, "sample_width": 90, "sample_height": 60, "sample_frames": 49,
        "patch_size": 2, "max_text_seq_length": 226, **extra})


OFFICIAL = {
    "THUDM/CogVideoX-2b": {
        "transformer": _transformer(30, 30), "text_encoder": T5_XXL, "vae": VAE},
    "THUDM/CogVideoX-5b": {
        "transformer": _transformer(48, 42, use_rotary_positional_embeddings=True),
        "text_encoder": T5_XXL, "vae": VAE},
    "THUDM/CogVideoX-5b-I2V": {
        "transformer": _transformer(48, 42, in_channels=32, use_rotary_positional_embeddings=True,
                                    use_learned_positional_embeddings=True),
        "text_encoder": T5_XXL, "vae": VAE},
    "THUDM/CogVideoX1.5-5B": {
        "transformer": _transformer(48, 42, use_rotary_positional_embeddings=True,
                                    patch_size_t=2, patch_bias=False, sample_width=170,
                                    sample_height=96, sample_frames=81,
                                    max_text_seq_length=224),
        "text_encoder": T5_XXL, "vae": VAE},
}
