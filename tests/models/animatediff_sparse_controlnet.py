"""A tiny random AnimateDiff SparseCtrl pipeline (configs as in diffusers' own AnimateDiff
SparseControlNet tests; see models.animatediff)."""

from .animatediff import animatediff_components, animatediff_pipeline


def build_animatediff_sparse_controlnet_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=16, width=16,
    # num_frames=2, num_inference_steps=2, guidance_scale=7.5, conditioning_frames=<16x16
    # image>, controlnet_frame_indices=[0], output_type="np") gives 2 finite 16x16 frames.
    from diffusers import AnimateDiffSparseControlNetPipeline

    return animatediff_pipeline(AnimateDiffSparseControlNetPipeline,
                                **animatediff_components(small=True, controlnet="sparse"))
