"""A tiny random Text2Video-Zero SDXL pipeline (configs as in diffusers' own tests for it; both
tokenizers built in code, see models.animatediff)."""

import torch

from .animatediff import clip_text_encoder, clip_tokenizer


def build_text_to_video_zero_sdxl_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=16, width=16,
    # video_length=2, num_inference_steps=3, guidance_scale=5.0, t0=0, t1=1,
    # output_type="np").images is 2 finite 16x16 frames.
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        TextToVideoZeroSDXLPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        unet = UNet2DConditionModel(
            block_out_channels=(2, 4), layers_per_block=2, sample_size=2, norm_num_groups=2,
            in_channels=4, out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), attention_head_dim=(2, 4),
            use_linear_projection=True, addition_embed_type="text_time",
            addition_time_embed_dim=8, transformer_layers_per_block=(1, 2),
            projection_class_embeddings_input_dim=80,  # 6 * 8 + 32
            cross_attention_dim=64)
        scheduler = DDIMScheduler(
            num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear",
            clip_sample=True, set_alpha_to_one=True, steps_offset=0, prediction_type="epsilon",
            thresholding=False, timestep_spacing="leading")
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
    for module in (unet, vae, text_encoder, text_encoder_2):
        module.eval()
    return TextToVideoZeroSDXLPipeline(
        vae=vae, text_encoder=text_encoder, text_encoder_2=text_encoder_2,
        tokenizer=clip_tokenizer(), tokenizer_2=clip_tokenizer(), unet=unet,
        scheduler=scheduler, image_encoder=None, feature_extractor=None,
        add_watermarker=False)
