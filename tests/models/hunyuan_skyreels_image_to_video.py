"""A tiny random SkyReels (HunyuanVideo) image-to-video pipeline (configs as in diffusers'
own SkyReels tests), with ByT5 tokenizers built in code in place of the hub's Llama and CLIP
tokenizers (as porter_hunyuan's tiny.py does)."""

import torch


def build_hunyuan_skyreels_image_to_video_pipeline():
    # Checked in plain diffusers (CPU, float32) with the matrix entry's call: 9 finite 16x16
    # frames.
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        HunyuanSkyreelsImageToVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )
    from transformers import ByT5Tokenizer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = HunyuanVideoTransformer3DModel(
            in_channels=8, out_channels=4, num_attention_heads=2, attention_head_dim=10,
            num_layers=1, num_single_layers=1, num_refiner_layers=1, patch_size=1,
            patch_size_t=1, guidance_embeds=True, text_embed_dim=16, pooled_projection_dim=8,
            rope_axes_dim=(2, 4, 4))
        vae, text_encoder, text_encoder_2 = vae_and_text_encoders()
    for module in (transformer, vae, text_encoder, text_encoder_2):
        module.eval()
    return HunyuanSkyreelsImageToVideoPipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder=text_encoder, text_encoder_2=text_encoder_2, tokenizer=ByT5Tokenizer(),
        tokenizer_2=ByT5Tokenizer())


def vae_and_text_encoders():
    """The tiny VAE, Llama and CLIP text encoders of diffusers' HunyuanVideo image-to-video
    tests (SkyReels, Framepack), each made from seed 0."""
    from transformers import CLIPTextConfig, CLIPTextModel, LlamaConfig, LlamaModel

    vae = tiny_vae()
    torch.manual_seed(0)
    text_encoder = LlamaModel(LlamaConfig(
        bos_token_id=0, eos_token_id=2, hidden_size=16, intermediate_size=37,
        layer_norm_eps=1e-05, num_attention_heads=4, num_hidden_layers=2, pad_token_id=1,
        vocab_size=1000, hidden_act="gelu"))
    torch.manual_seed(0)
    text_encoder_2 = CLIPTextModel(CLIPTextConfig(
        bos_token_id=0, eos_token_id=2, hidden_size=8, intermediate_size=37,
        layer_norm_eps=1e-05, num_attention_heads=4, num_hidden_layers=2, pad_token_id=1,
        vocab_size=1000, hidden_act="gelu", projection_dim=32))
    return vae, text_encoder, text_encoder_2


def tiny_vae():
    """The tiny VAE of diffusers' HunyuanVideo tests, made from seed 0."""
    from diffusers import AutoencoderKLHunyuanVideo

    torch.manual_seed(0)
    vae = AutoencoderKLHunyuanVideo(
        in_channels=3, out_channels=3, latent_channels=4,
        down_block_types=("HunyuanVideoDownBlock3D",) * 4,
        up_block_types=("HunyuanVideoUpBlock3D",) * 4, block_out_channels=(8,) * 4,
        layers_per_block=1, act_fn="silu", norm_num_groups=4, scaling_factor=0.476986,
        spatial_compression_ratio=8, temporal_compression_ratio=4,
        mid_block_add_attention=True)
    return vae
