"""A tiny random VideoToVideoSD (ModelScope/zeroscope video-to-video) pipeline (configs as in
diffusers' own video-to-video tests; tokenizer built in code, see models.animatediff)."""

import torch

from .animatediff import clip_text_encoder, clip_tokenizer


def build_video_to_video_sd_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", video=<2 16x16 images>,
    # num_inference_steps=2, guidance_scale=6.0, output_type="np") gives 2 finite 16x16
    # frames (the output's size is the video's).
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        UNet3DConditionModel,
        VideoToVideoSDPipeline,
    )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        unet = UNet3DConditionModel(
            block_out_channels=(4, 8), layers_per_block=1, sample_size=32, in_channels=4,
            out_channels=4, down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
            up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"), cross_attention_dim=32,
            attention_head_dim=4, norm_num_groups=2)
        scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012,
                                  beta_schedule="scaled_linear", clip_sample=True,
                                  set_alpha_to_one=False)
        torch.manual_seed(0)
        vae = AutoencoderKL(
            block_out_channels=[8], in_channels=3, out_channels=3,
            down_block_types=["DownEncoderBlock2D"], up_block_types=["UpDecoderBlock2D"],
            latent_channels=4, sample_size=32, norm_num_groups=2)
        torch.manual_seed(0)
        text_encoder = clip_text_encoder(hidden_act="gelu", projection_dim=512)
    for module in (unet, vae, text_encoder):
        module.eval()
    return VideoToVideoSDPipeline(vae=vae, text_encoder=text_encoder, tokenizer=clip_tokenizer(),
                                  unet=unet, scheduler=scheduler)
