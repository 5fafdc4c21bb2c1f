"""A tiny random Stable Video Diffusion image-to-video pipeline (configs as in diffusers' own
SVD tests, but for the image encoder's image_size: 224, with 16-pixel patches, in place of 32
with 1-pixel ones, since the pipeline resizes a PIL image to 224x224 for it; the tests give a
tensor, which it does not resize). It takes no prompt: the image, through a CLIP vision
encoder, conditions it."""

import torch


def build_stable_video_diffusion_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(image=<16x16 image>, height=16, width=16,
    # num_frames=2, num_inference_steps=2, min_guidance_scale=1.0, max_guidance_scale=2.5,
    # output_type="np") gives 2 finite 16x16 frames.
    from diffusers import (
        AutoencoderKLTemporalDecoder,
        EulerDiscreteScheduler,
        StableVideoDiffusionPipeline,
        UNetSpatioTemporalConditionModel,
    )
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        CLIPVisionModelWithProjection,
    )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        unet = UNetSpatioTemporalConditionModel(
            block_out_channels=(32, 64), layers_per_block=2, sample_size=32, in_channels=8,
            out_channels=4,
            down_block_types=("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
            up_block_types=("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
            cross_attention_dim=32, num_attention_heads=8,
            projection_class_embeddings_input_dim=96, addition_time_embed_dim=32)
        scheduler = EulerDiscreteScheduler(
            beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
            interpolation_type="linear", num_train_timesteps=1000,
            prediction_type="v_prediction", sigma_max=700.0, sigma_min=0.002, steps_offset=1,
            timestep_spacing="leading", timestep_type="continuous", use_karras_sigmas=True)
        torch.manual_seed(0)
        vae = AutoencoderKLTemporalDecoder(
            block_out_channels=[32, 64], in_channels=3, out_channels=3,
            down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"], latent_channels=4)
        torch.manual_seed(0)
        image_encoder = CLIPVisionModelWithProjection(CLIPVisionConfig(
            hidden_size=32, projection_dim=32, num_hidden_layers=5, num_attention_heads=4,
            image_size=224, intermediate_size=37, patch_size=16))
    for module in (unet, vae, image_encoder):
        module.eval()
    return StableVideoDiffusionPipeline(
        vae=vae, image_encoder=image_encoder, unet=unet, scheduler=scheduler,
        feature_extractor=CLIPImageProcessor(crop_size=32, size=32))
