"""Official HunyuanVideo and HunyuanVideo 1.5 configurations (diffusers-format
checkpoints), so the real-size recipes validate and plan without weights."""

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

OFFICIAL["hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-720p_t2v"] = {
    "transformer": ("diffusers", "HunyuanVideo15Transformer3DModel", {
        "in_channels": 65, "out_channels": 32, "num_attention_heads": 16,
        "attention_head_dim": 128, "num_layers": 54, "num_refiner_layers": 2, "mlp_ratio": 4.0,
        "patch_size": 1, "patch_size_t": 1, "qk_norm": "rms_norm", "text_embed_dim": 3584,
        "text_embed_2_dim": 1472, "image_embed_dim": 1152, "rope_theta": 256.0,
        "rope_axes_dim": [16, 56, 56], "target_size": 960, "task_type": "t2v"}),
    "text_encoder": ("transformers", "Qwen2_5_VLTextModel", {  # Qwen2.5-VL-7B's language model
        "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "rope_theta": 1000000.0, "rope_scaling": {"mrope_section": [16, 24, 24],
                                                  "rope_type": "default", "type": "default"}}),
    "text_encoder_2": ("transformers", "T5EncoderModel", {  # ByT5-small: glyph text
        "vocab_size": 384, "d_model": 1472, "d_kv": 64, "d_ff": 3584, "num_layers": 12,
        "num_heads": 6, "feed_forward_proj": "gated-gelu", "is_gated_act": True,
        "tie_word_embeddings": False}),
    # the published configuration's compression, which the family reads without
    # importing diffusers (the rest: the class's defaults)
    "vae": ("diffusers", "AutoencoderKLHunyuanVideo15", {"spatial_compression_ratio": 16,
                                                          "temporal_compression_ratio": 4}),
}
