"""Official HunyuanVideo configurations (diffusers-format checkpoint), so the
real-size recipe validates and plans without weights."""

from __future__ import annotations

OFFICIAL = {
    "hunyuanvideo-community/HunyuanVideo": {
        "transformer": ("diffusers", "HunyuanVideoTransformer3DModel", {
            "in_channels": 16, "out_channels": 16, "num_attention_heads": 24,
            "attention_head_dim": 128, "num_layers": 20, "num_single_layers": 40,
            "num_refiner_layers": 2, "mlp_ratio": 4.0, "patch_size": 2, "patch_size_t": 1,
            "qk_norm": "rms_norm", "guidance_embeds": True, "text_embed_dim": 4096,
            "pooled_projection_dim": 768, "rope_theta": 256.0, "rope_axes_dim": [16, 56, 56]}),
        "text_encoder": ("transformers", "LlamaModel", {
            "vocab_size": 128320, "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0}),
        "text_encoder_2": ("transformers", "CLIPTextModel", {
            "vocab_size": 49408, "hidden_size": 768, "intermediate_size": 3072,
            "num_hidden_layers": 12, "num_attention_heads": 12, "projection_dim": 768,
            "max_position_embeddings": 77, "hidden_act": "quick_gelu"}),
        "vae": ("diffusers", "AutoencoderKLHunyuanVideo", {
            "in_channels": 3, "out_channels": 3, "latent_channels": 16,
            "block_out_channels": [128, 256, 512, 512], "layers_per_block": 2,
            "down_block_types": ["HunyuanVideoDownBlock3D"] * 4,
            "up_block_types": ["HunyuanVideoUpBlock3D"] * 4, "norm_num_groups": 32,
            "scaling_factor": 0.476986, "spatial_compression_ratio": 8,
            "temporal_compression_ratio": 4, "mid_block_add_attention": True}),
    },
}
