"""A tiny random AnimateDiff video-to-video ControlNet pipeline (configs as in diffusers' own
tests for it; see models.animatediff)."""

from .animatediff import animatediff_components, animatediff_pipeline


def build_animatediff_video_to_video_controlnet_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(video=<2 16x16 images>, prompt="a cat",
    # conditioning_frames=<2 16x16 images>, height=16, width=16, num_inference_steps=2,
    # guidance_scale=7.5, output_type="np") gives 2 finite 16x16 frames.
    from diffusers import AnimateDiffVideoToVideoControlNetPipeline

    return animatediff_pipeline(AnimateDiffVideoToVideoControlNetPipeline,
                                **animatediff_components(small=True, controlnet="controlnet"))
