"""A tiny random SkyReels-V2 diffusion-forcing text-to-video pipeline (configs as in
diffusers' own SkyReels-V2 tests; their FlowMatchUniPCMultistepScheduler is the installed
diffusers' UniPCMultistepScheduler with flow sigmas)."""

import torch

from models.skyreels_v2 import skyreels_transformer
from models.wan_parts import evaluated, tiny_t5, wan_vae


def flow_unipc(shift=7.0):
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                   flow_shift=shift)


def build_skyreels_v2_df_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=16, width=16,
    # num_frames=9, num_inference_steps=2, guidance_scale=6.0, max_sequence_length=16,
    # output_type="np") gives 9 finite 16x16 frames.
    from diffusers import SkyReelsV2DiffusionForcingPipeline

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        vae = wan_vae()
        torch.manual_seed(0)
        text_encoder, tokenizer = tiny_t5()
        torch.manual_seed(0)
        transformer = skyreels_transformer()
    evaluated(vae, text_encoder, transformer)
    return SkyReelsV2DiffusionForcingPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae,
        scheduler=flow_unipc())
