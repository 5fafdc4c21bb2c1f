"""A tiny random PIA (image-to-video AnimateDiff) pipeline (configs as in diffusers' own PIA
tests: the AnimateDiff ones with a motion adapter whose conv_in takes 9 channels, the latents
plus the image's latents and mask; see models.animatediff)."""

import torch

from .animatediff import animatediff_components, animatediff_pipeline


def build_pia_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(image=<16x16 image>, prompt="a cat",
    # height=16, width=16, num_frames=2, num_inference_steps=2, guidance_scale=7.5,
    # output_type="np") gives 2 finite 16x16 frames.
    from diffusers import MotionAdapter, PIAPipeline

    components = animatediff_components()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        components["motion_adapter"] = MotionAdapter(
            block_out_channels=(32, 64), motion_layers_per_block=2, motion_norm_num_groups=2,
            motion_num_attention_heads=4, conv_in_channels=9).eval()
    return animatediff_pipeline(PIAPipeline, **components)
