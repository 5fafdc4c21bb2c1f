"""A tiny random I2VGen-XL image-to-video pipeline (configs as in diffusers' own I2VGen-XL
tests; tokenizer built in code, see models.animatediff)."""

import torch

from .animatediff import clip_text_encoder, clip_tokenizer


def build_i2vgenxl_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", image=<16x16 image>, height=16,
    # width=16, num_frames=2, num_inference_steps=2, guidance_scale=6.0, output_type="np")
    # gives 2 finite 16x16 frames.
    from diffusers import AutoencoderKL, DDIMScheduler, I2VGenXLPipeline
    from diffusers.models.unets import I2VGenXLUNet
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        CLIPVisionModelWithProjection,
    )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012,
                                  beta_schedule="scaled_linear", clip_sample=False,
                                  set_alpha_to_one=False)
        torch.manual_seed(0)
        unet = I2VGenXLUNet(
            block_out_channels=(4, 8), layers_per_block=1, sample_size=32, in_channels=4,
            out_channels=4, down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
            up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"), cross_attention_dim=4,
            attention_head_dim=4, num_attention_heads=None, norm_num_groups=2)
        torch.manual_seed(0)
        vae = AutoencoderKL(
            block_out_channels=(8,), in_channels=3, out_channels=3,
            down_block_types=["DownEncoderBlock2D"], up_block_types=["UpDecoderBlock2D"],
            latent_channels=4, sample_size=32, norm_num_groups=2)
        torch.manual_seed(0)
        text_encoder = clip_text_encoder(hidden_size=4, intermediate_size=16, heads=2, layers=2,
                                         hidden_act="gelu", projection_dim=32)
        torch.manual_seed(0)
        image_encoder = CLIPVisionModelWithProjection(CLIPVisionConfig(
            hidden_size=4, projection_dim=4, num_hidden_layers=2, num_attention_heads=2,
            image_size=32, intermediate_size=16, patch_size=1))
    for module in (unet, vae, text_encoder, image_encoder):
        module.eval()
    return I2VGenXLPipeline(
        vae=vae, text_encoder=text_encoder, tokenizer=clip_tokenizer(),
        image_encoder=image_encoder, feature_extractor=CLIPImageProcessor(crop_size=32, size=32),
        unet=unet, scheduler=scheduler)
