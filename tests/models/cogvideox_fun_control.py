"""A tiny random CogVideoX Fun-Control pipeline (configs as in diffusers' own CogVideoX
Fun-Control tests: those of models.cogvideox_video2video, the transformer taking the control
video's latents too, 8 input channels)."""

from models.cogvideox_video2video import cogvideox_parts


def build_cogvideox_fun_control_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", control_video=<8 16x16
    # frames>, height=16, width=16, num_inference_steps=2, guidance_scale=6.0,
    # max_sequence_length=16, output_type="np") gives 8 finite 16x16 frames.
    from diffusers import CogVideoXFunControlPipeline, DDIMScheduler
    from transformers import ByT5Tokenizer

    transformer, vae, text_encoder = cogvideox_parts(in_channels=8)
    return CogVideoXFunControlPipeline(tokenizer=ByT5Tokenizer(), text_encoder=text_encoder,
                                       vae=vae, transformer=transformer,
                                       scheduler=DDIMScheduler())
