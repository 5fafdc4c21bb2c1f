"""A tiny random LTX-2 image-to-video pipeline: the components of the tiny LTX2Pipeline
(configs as in diffusers' own LTX-2 image-to-video tests, which are the same)."""


def build_ltx2_image_to_video_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(image, "a cat", height=32, width=32,
    # num_frames=5, num_inference_steps=2, max_sequence_length=16, frame_rate=25.0,
    # output_type="np") gives 5 finite 32x32 frames.
    from diffusers import LTX2ImageToVideoPipeline

    from models.ltx2 import ltx2_components

    return LTX2ImageToVideoPipeline(**ltx2_components())
