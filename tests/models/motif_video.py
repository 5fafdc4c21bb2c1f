"""A tiny random Motif-Video text-to-video pipeline (configs as in diffusers' own Motif-Video
tests; a ByT5 tokenizer built in code stands in for the hub's tiny-random-t5 one)."""

import torch


def tiny_t5gemma2_encoder(vision: bool = False):
    """The tests' T5Gemma2 encoder; with ``vision``, the image-to-video tests' SigLIP tower."""
    from transformers import (
        SiglipVisionConfig,
        T5Gemma2Encoder,
        T5Gemma2EncoderConfig,
        T5Gemma2TextConfig,
    )

    text_config = T5Gemma2TextConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        vocab_size=1104, max_position_embeddings=128, head_dim=16, num_key_value_heads=2,
        dropout_rate=0.0)
    if not vision:
        return T5Gemma2Encoder(T5Gemma2EncoderConfig(text_config=text_config))
    return T5Gemma2Encoder(T5Gemma2EncoderConfig(
        text_config=text_config, vision_config=SiglipVisionConfig(
            hidden_size=4, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            image_size=16, patch_size=4, num_channels=3)))


def tiny_motif_parts(in_channels: int, image_embed_dim: int | None = None):
    """vae, text encoder and transformer, each seeded as in the diffusers tests."""
    from diffusers import AutoencoderKLWan
    from diffusers.models.transformers.transformer_motif_video import (
        MotifVideoTransformer3DModel,
    )

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    torch.manual_seed(0)
    text_encoder = tiny_t5gemma2_encoder(vision=image_embed_dim is not None)
    torch.manual_seed(0)
    image = {} if image_embed_dim is None else {"image_embed_dim": image_embed_dim}
    transformer = MotifVideoTransformer3DModel(
        in_channels=in_channels, out_channels=16, num_attention_heads=2, attention_head_dim=12,
        num_layers=1, num_single_layers=1, mlp_ratio=4.0, patch_size=1, patch_size_t=1,
        qk_norm="rms_norm", text_embed_dim=32, rope_axes_dim=(4, 4, 4), **image)
    for module in (vae, text_encoder, transformer):
        module.eval()
    return vae, text_encoder, transformer


def build_motif_video_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=16, width=16,
    # num_frames=9, num_inference_steps=2, max_sequence_length=16, output_type="np") gives
    # 9 finite 16x16 frames. Guidance is the AdaptiveProjectedGuidance guider's (no
    # guidance_scale argument); its negative prompt defaults to "".
    from diffusers import FlowMatchEulerDiscreteScheduler, MotifVideoPipeline
    from diffusers.guiders import AdaptiveProjectedGuidance
    from transformers import ByT5Tokenizer

    with torch.random.fork_rng(devices=[]):
        vae, text_encoder, transformer = tiny_motif_parts(in_channels=33)
    return MotifVideoPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), vae=vae,
        text_encoder=text_encoder, tokenizer=ByT5Tokenizer(), transformer=transformer,
        guider=AdaptiveProjectedGuidance(), feature_extractor=None)
