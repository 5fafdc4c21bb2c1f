"""A tiny random Helios pyramid pipeline: the Helios test's components (diffusers has no
pyramid test) with the scheduler's default three stages, one per pyramid level, so the
frames are 64x64 (latents of 8, 4 and 2 across). Its gamma is 0.3, not the default 1/3,
with which the 2x2 block-noise covariance is singular (eigenvalue 1 - 3 gamma = 0) and
torch.linalg.cholesky fails on the CPU in float32."""

import torch

from models.helios import helios_parts


def build_helios_pyramid_pipeline(scheduler_class: str = "HeliosScheduler"):
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=64, width=64,
    # num_frames=9, guidance_scale=1.0, max_sequence_length=16,
    # pyramid_num_inference_steps_list=[1, 1, 1], output_type="np") gives finite frames.
    import diffusers

    with torch.random.fork_rng(devices=[]):
        vae, text_encoder, tokenizer, transformer = helios_parts()
    scheduler = getattr(diffusers, scheduler_class)(use_dynamic_shifting=True, gamma=0.3)
    return diffusers.HeliosPyramidPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
        scheduler=scheduler)
