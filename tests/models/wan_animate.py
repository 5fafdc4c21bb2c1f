"""A tiny random Wan Animate pipeline (configs as in diffusers' own Wan Animate test)."""

import torch

from models.wan_parts import clip_image_encoder, evaluated, tiny_t5, wan_vae


def build_wan_animate_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(image, pose_video (9 frames),
    # face_video (9 frames), "a cat", height=16, width=16, num_inference_steps=2,
    # guidance_scale=1.0, max_sequence_length=16, output_type="np") gives 9 finite 16x16
    # frames.
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        WanAnimatePipeline,
        WanAnimateTransformer3DModel,
    )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        vae = wan_vae()
        torch.manual_seed(0)
        text_encoder, tokenizer = tiny_t5()
        torch.manual_seed(0)
        transformer = WanAnimateTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
            in_channels=36, latent_channels=16, out_channels=16, text_dim=32, freq_dim=256,
            ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
            image_dim=4, rope_max_seq_len=32,
            motion_encoder_channel_sizes={"4": 16, "8": 16, "16": 16}, motion_encoder_size=16,
            motion_style_dim=8, motion_dim=4, motion_encoder_dim=16,
            face_encoder_hidden_dim=16, face_encoder_num_heads=2, inject_face_latents_blocks=2)
        torch.manual_seed(0)
        image_encoder, image_processor = clip_image_encoder(4)
    evaluated(vae, text_encoder, transformer, image_encoder)
    return WanAnimatePipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), image_processor=image_processor,
        image_encoder=image_encoder, transformer=transformer)
