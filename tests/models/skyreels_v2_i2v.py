"""A tiny random SkyReels-V2 image-to-video pipeline (configs as in diffusers' own
SkyReels-V2 image-to-video test)."""

import torch

from models.skyreels_v2 import skyreels_transformer
from models.skyreels_v2_df import flow_unipc
from models.wan_parts import clip_image_encoder, evaluated, tiny_t5, wan_vae


def build_skyreels_v2_i2v_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(image, "a cat", height=16, width=16,
    # num_frames=9, num_inference_steps=2, guidance_scale=6.0, max_sequence_length=16,
    # output_type="np") gives 9 finite 16x16 frames.
    from diffusers import SkyReelsV2ImageToVideoPipeline

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        vae = wan_vae()
        torch.manual_seed(0)
        text_encoder, tokenizer = tiny_t5()
        torch.manual_seed(0)
        transformer = skyreels_transformer(in_channels=36, image_dim=4)
        torch.manual_seed(0)
        image_encoder, image_processor = clip_image_encoder(32)
    evaluated(vae, text_encoder, transformer, image_encoder)
    return SkyReelsV2ImageToVideoPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, image_encoder=image_encoder,
        image_processor=image_processor, transformer=transformer, vae=vae,
        scheduler=flow_unipc())
