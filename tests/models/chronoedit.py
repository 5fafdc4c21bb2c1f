"""A tiny random ChronoEdit pipeline (configs as in diffusers' own ChronoEdit test)."""

import torch

from models.wan_parts import clip_image_encoder, evaluated, tiny_t5, wan_vae


def build_chronoedit_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(image, "a cat", height=16, width=16,
    # num_frames=5, num_inference_steps=2, guidance_scale=6.0, max_sequence_length=16,
    # output_type="np") gives finite 16x16 frames.
    from diffusers import (
        ChronoEditPipeline,
        ChronoEditTransformer3DModel,
        FlowMatchEulerDiscreteScheduler,
    )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        vae = wan_vae()
        torch.manual_seed(0)
        text_encoder, tokenizer = tiny_t5()
        torch.manual_seed(0)
        transformer = ChronoEditTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
            in_channels=36, out_channels=16, text_dim=32, freq_dim=256, ffn_dim=32,
            num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
            rope_max_seq_len=32, image_dim=4)
        torch.manual_seed(0)
        image_encoder, image_processor = clip_image_encoder(32)
    evaluated(vae, text_encoder, transformer, image_encoder)
    return ChronoEditPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, image_encoder=image_encoder,
        image_processor=image_processor, transformer=transformer, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))
