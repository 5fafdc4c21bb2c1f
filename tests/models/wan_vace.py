"""A tiny random Wan VACE pipeline (configs as in diffusers' own VACE test)."""

import torch

from models.wan_parts import evaluated, tiny_t5, wan_vae


def build_wan_vace_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", video (9 frames), mask
    # (9 frames), height=16, width=16, num_frames=9, num_inference_steps=2,
    # guidance_scale=6.0, max_sequence_length=16, output_type="np") gives 9 finite 16x16
    # frames.
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        WanVACEPipeline,
        WanVACETransformer3DModel,
    )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        vae = wan_vae()
        torch.manual_seed(0)
        text_encoder, tokenizer = tiny_t5()
        torch.manual_seed(0)
        transformer = WanVACETransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
            in_channels=16, out_channels=16, text_dim=32, freq_dim=256, ffn_dim=32,
            num_layers=3, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
            rope_max_seq_len=32, vace_layers=[0, 2], vace_in_channels=96)
    evaluated(vae, text_encoder, transformer)
    return WanVACEPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))
