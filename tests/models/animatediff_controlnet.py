"""A tiny random AnimateDiff ControlNet pipeline (configs as in diffusers' own AnimateDiff
ControlNet tests; see models.animatediff)."""

from .animatediff import animatediff_components, animatediff_pipeline


def build_animatediff_controlnet_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=16, width=16,
    # num_frames=2, num_inference_steps=2, guidance_scale=7.5, conditioning_frames=<2 16x16
    # images>, output_type="np") gives 2 finite 16x16 frames.
    from diffusers import AnimateDiffControlNetPipeline

    return animatediff_pipeline(AnimateDiffControlNetPipeline,
                                **animatediff_components(small=True, controlnet="controlnet"))
