"""A tiny random AnimateDiff video-to-video pipeline (configs as in diffusers' own AnimateDiff
video-to-video tests, the same as the text-to-video ones; see models.animatediff)."""

from .animatediff import animatediff_components, animatediff_pipeline


def build_animatediff_video_to_video_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(video=<2 16x16 images>, prompt="a cat",
    # height=16, width=16, num_inference_steps=2, guidance_scale=7.5, output_type="np")
    # gives 2 finite 16x16 frames.
    from diffusers import AnimateDiffVideoToVideoPipeline

    return animatediff_pipeline(AnimateDiffVideoToVideoPipeline, **animatediff_components())
