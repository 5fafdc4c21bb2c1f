"""A tiny random AnimateDiff PAG pipeline (the (8, 8)-channel configs of diffusers' own
AnimateDiff PAG tests; see models.animatediff)."""

from .animatediff import animatediff_components, animatediff_pipeline


def build_animatediff_pag_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=16, width=16,
    # num_frames=2, num_inference_steps=2, guidance_scale=7.5, pag_scale=3.0,
    # output_type="np") gives 2 finite 16x16 frames.
    from diffusers import AnimateDiffPAGPipeline

    return animatediff_pipeline(AnimateDiffPAGPipeline, **animatediff_components(small=True))
