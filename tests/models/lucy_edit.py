"""A tiny random Lucy Edit pipeline. diffusers has no Lucy test: this is the tiny Wan of
its Wan tests, whose transformer takes the noise latents and the input video's latents
side by side (32 channels), as Lucy's does."""

import torch

from models.wan_parts import evaluated, tiny_t5, wan_vae
from models.wan_v2v import wan_transformer


def build_lucy_edit_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(video (9 frames), "a cat", height=16,
    # width=16, num_frames=9, num_inference_steps=2, guidance_scale=6.0,
    # max_sequence_length=16, output_type="np") gives 9 finite 16x16 frames.
    from diffusers import FlowMatchEulerDiscreteScheduler, LucyEditPipeline

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        vae = wan_vae()
        torch.manual_seed(0)
        text_encoder, tokenizer = tiny_t5()
        torch.manual_seed(0)
        transformer = wan_transformer(in_channels=32)
    evaluated(vae, text_encoder, transformer)
    return LucyEditPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))
