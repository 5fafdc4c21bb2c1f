"""A tiny random LTX-Video image-to-video pipeline: the components of the tiny LTXPipeline
(configs as in diffusers' own LTX image-to-video tests, which are the same)."""


def build_ltx_image_to_video_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(image, "a cat", height=32, width=32,
    # num_frames=9, num_inference_steps=2, guidance_scale=3.0, max_sequence_length=16,
    # output_type="np") gives 9 finite 32x32 frames.
    from diffusers import LTXImageToVideoPipeline

    from models.ltx import build_ltx_pipeline

    return LTXImageToVideoPipeline(**build_ltx_pipeline().components)
