"""A tiny random Sana-Video image-to-video pipeline (configs as in diffusers' own Sana-Video
I2V tests: the components of models.sana_video, with a FlowMatchEulerDiscreteScheduler)."""


def build_sana_video_i2v_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(image=<32x32 image>, prompt="a cat",
    # height=32, width=32, frames=9, num_inference_steps=2, guidance_scale=6.0,
    # max_sequence_length=16, complex_human_instruction=[], use_resolution_binning=False,
    # output_type="np") gives 9 finite 32x32 frames.
    from diffusers import FlowMatchEulerDiscreteScheduler, SanaImageToVideoPipeline

    from models.sana_video import build_sana_video_pipeline

    parts = build_sana_video_pipeline().components
    return SanaImageToVideoPipeline(
        tokenizer=parts["tokenizer"], text_encoder=parts["text_encoder"], vae=parts["vae"],
        transformer=parts["transformer"], scheduler=FlowMatchEulerDiscreteScheduler())
