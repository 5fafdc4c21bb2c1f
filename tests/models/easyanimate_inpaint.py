"""A tiny random EasyAnimate inpainting pipeline (configs as in diffusers' own EasyAnimate
inpaint tests: the components of models.easyanimate, but for the transformer's input
channels)."""

import torch


def build_easyanimate_inpaint_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", video=<(1, 3, 5, 16, 16)
    # tensor in [0, 1]>, mask_video=<(1, 1, 5, 16, 16) tensor of 0 and 255>, height=16,
    # width=16, num_frames=5, num_inference_steps=2, guidance_scale=6.0, negative_prompt="",
    # output_type="np") gives 5 finite 16x16 frames. It takes tensors only: a list of PIL
    # frames fails (video.shape, pipeline_easyanimate_inpaint.py:984).
    from diffusers import EasyAnimateInpaintPipeline, FlowMatchEulerDiscreteScheduler

    from models.easyanimate import easyanimate_parts, qwen2_byte_tokenizer

    with torch.random.fork_rng(devices=[]):
        # an inpainting transformer (as the real InP checkpoints): it takes the latents, the
        # mask's latents and the masked video's, 4 + 4 + 4 channels. The tests' 4-channel one
        # fails in diffusers 0.42.1 itself (torch.tensor([t], noise),
        # pipeline_easyanimate_inpaint.py:1206); with resize_inpaint_mask_directly (the
        # default) it reads vae.config.cache_mag_vae, which AutoencoderKLMagvit's config
        # lacks (AttributeError).
        transformer, vae, text_encoder = easyanimate_parts(
            in_channels=12, resize_inpaint_mask_directly=False)
    return EasyAnimateInpaintPipeline(vae=vae, text_encoder=text_encoder,
                                      tokenizer=qwen2_byte_tokenizer(), transformer=transformer,
                                      scheduler=FlowMatchEulerDiscreteScheduler())
