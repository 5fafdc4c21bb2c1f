"""A tiny random EasyAnimate control pipeline (diffusers has no tests for it: the components
of models.easyanimate, its transformer taking the latents, the control video's and the
reference image's, 4 + 4 + 4 input channels, as the real Control checkpoints do)."""

import torch


def build_easyanimate_control_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", control_video=<(1, 3, 5, 16,
    # 16) tensor in [0, 1]>, height=16, width=16, num_frames=5, num_inference_steps=2,
    # guidance_scale=6.0, negative_prompt="", output_type="np") gives 5 finite 16x16 frames.
    # It takes tensors only: a list of PIL frames fails (control_video.shape,
    # pipeline_easyanimate_control.py:857).
    from diffusers import EasyAnimateControlPipeline, FlowMatchEulerDiscreteScheduler

    from models.easyanimate import easyanimate_parts, qwen2_byte_tokenizer

    with torch.random.fork_rng(devices=[]):
        transformer, vae, text_encoder = easyanimate_parts(in_channels=12)
    return EasyAnimateControlPipeline(vae=vae, text_encoder=text_encoder,
                                      tokenizer=qwen2_byte_tokenizer(), transformer=transformer,
                                      scheduler=FlowMatchEulerDiscreteScheduler())
