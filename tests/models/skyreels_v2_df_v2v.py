"""A tiny random SkyReels-V2 diffusion-forcing video-to-video pipeline (configs as in
diffusers' own SkyReels-V2 video-to-video test)."""

import torch

from models.skyreels_v2 import skyreels_transformer
from models.wan_parts import evaluated, tiny_t5, wan_vae


def build_skyreels_v2_df_v2v_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(video (7 frames), "a cat", height=16,
    # width=16, num_frames=17, num_inference_steps=2, guidance_scale=6.0,
    # max_sequence_length=16, overlap_history=3, base_num_frames=5, output_type="np")
    # gives 7 + 17 finite 16x16 frames.
    from diffusers import (
        SkyReelsV2DiffusionForcingVideoToVideoPipeline,
        UniPCMultistepScheduler,
    )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        vae = wan_vae()
        torch.manual_seed(0)
        text_encoder, tokenizer = tiny_t5()
        torch.manual_seed(0)
        transformer = skyreels_transformer()
    evaluated(vae, text_encoder, transformer)
    return SkyReelsV2DiffusionForcingVideoToVideoPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae,
        scheduler=UniPCMultistepScheduler(flow_shift=5.0, use_flow_sigmas=True))
