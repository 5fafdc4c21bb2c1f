"""A tiny random AnimateDiff SDXL pipeline (configs as in diffusers' own AnimateDiff SDXL
tests; both tokenizers built in code, see models.animatediff)."""

import torch

from .animatediff import animatediff_pipeline, clip_text_encoder, clip_tokenizer


def build_animatediff_sdxl_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=16, width=16,
    # num_frames=2, num_inference_steps=2, guidance_scale=7.5, output_type="np") gives
    # 2 finite 16x16 frames.
    from diffusers import (
        AnimateDiffSDXLPipeline,
        AutoencoderKL,
        DDIMScheduler,
        MotionAdapter,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        unet = UNet2DConditionModel(
            block_out_channels=(32, 64, 128), layers_per_block=2, sample_size=32,
            in_channels=4, out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
            attention_head_dim=(2, 4, 8), use_linear_projection=True,
            addition_embed_type="text_time", addition_time_embed_dim=8,
            transformer_layers_per_block=(1, 2, 4),
            projection_class_embeddings_input_dim=80,  # 6 * 8 + 32
            cross_attention_dim=64, norm_num_groups=1)
        scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012,
                                  beta_schedule="linear", clip_sample=False)
        torch.manual_seed(0)
        vae = AutoencoderKL(
            block_out_channels=[32, 64], in_channels=3, out_channels=3,
            down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
            up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"], latent_channels=4,
            sample_size=128)
        torch.manual_seed(0)
        text_encoder = clip_text_encoder(hidden_act="gelu", projection_dim=32)
        text_encoder_2 = CLIPTextModelWithProjection(
            CLIPTextConfig(**text_encoder.config.to_dict()))
        torch.manual_seed(0)
        motion_adapter = MotionAdapter(
            block_out_channels=(32, 64, 128), motion_layers_per_block=2,
            motion_norm_num_groups=2, motion_num_attention_heads=4, use_motion_mid_block=False)
    for module in (unet, vae, text_encoder, text_encoder_2, motion_adapter):
        module.eval()
    return animatediff_pipeline(
        AnimateDiffSDXLPipeline, unet=unet, scheduler=scheduler, vae=vae,
        motion_adapter=motion_adapter, text_encoder=text_encoder, tokenizer=clip_tokenizer(),
        text_encoder_2=text_encoder_2, tokenizer_2=clip_tokenizer(), feature_extractor=None,
        image_encoder=None)
