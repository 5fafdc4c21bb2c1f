"""A tiny random HunyuanVideo Framepack pipeline (configs as in diffusers' own Framepack
tests). The hub tokenizers are replaced by ByT5 tokenizers built in code (as porter_hunyuan's
tiny.py does), and hf-internal-testing/tiny-random-SiglipVisionModel by a SiglipVisionModel
built from a small config in code (hidden size 32 = the transformer's image_proj_dim, 30-pixel
images as the test's feature extractor gives)."""

import torch


def build_hunyuan_video_framepack_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(image, "a cat", height=32, width=32,
    # num_frames=9, num_inference_steps=2, guidance_scale=4.5, latent_window_size=3,
    # max_sequence_length=64, prompt_template={"template": "{}", "crop_start": 0},
    # output_type="np") gives 13 finite 32x32 frames.
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideoFramepackPipeline,
        HunyuanVideoFramepackTransformer3DModel,
    )
    from transformers import (
        ByT5Tokenizer,
        SiglipImageProcessor,
        SiglipVisionConfig,
        SiglipVisionModel,
    )

    from models.hunyuan_skyreels_image_to_video import vae_and_text_encoders

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = HunyuanVideoFramepackTransformer3DModel(
            in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10,
            num_layers=1, num_single_layers=1, num_refiner_layers=1, patch_size=2,
            patch_size_t=1, guidance_embeds=True, text_embed_dim=16, pooled_projection_dim=8,
            rope_axes_dim=(2, 4, 4), image_condition_type=None, has_image_proj=True,
            image_proj_dim=32, has_clean_x_embedder=True)
        vae, text_encoder, text_encoder_2 = vae_and_text_encoders()
        torch.manual_seed(0)
        image_encoder = SiglipVisionModel(SiglipVisionConfig(
            hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2,
            image_size=30, patch_size=2))
    for module in (transformer, vae, text_encoder, text_encoder_2, image_encoder):
        module.eval()
    feature_extractor = SiglipImageProcessor(size={"height": 30, "width": 30})
    return HunyuanVideoFramepackPipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder=text_encoder, tokenizer=ByT5Tokenizer(), text_encoder_2=text_encoder_2,
        tokenizer_2=ByT5Tokenizer(), image_encoder=image_encoder,
        feature_extractor=feature_extractor)
