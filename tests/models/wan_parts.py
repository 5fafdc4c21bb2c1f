"""Tiny random parts shared by the Wan-derived pipelines of the matrix (Wan video-to-video,
VACE, SkyReels-V2, ChronoEdit, Lucy, Wan Animate, Helios, AnyFlow), as in diffusers' own
tests: the Wan VAE, and the hub's tiny-random-t5 text encoder rebuilt from its config in
code with a ByT5 tokenizer. Call them inside ``torch.random.fork_rng`` after seeding."""

import torch


def wan_vae(**overrides):
    from diffusers import AutoencoderKLWan

    settings = dict(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                    temperal_downsample=[False, True, True])
    return AutoencoderKLWan(**{**settings, **overrides})


def tiny_t5():
    """hf-internal-testing/tiny-random-t5 (its config, random weights) and a tokenizer."""
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    encoder = T5EncoderModel(T5Config(
        vocab_size=1103, d_model=32, d_kv=8, d_ff=37, num_layers=5, num_heads=4,
        relative_attention_num_buckets=8, initializer_factor=0.002))
    return encoder, ByT5Tokenizer()


def clip_image_encoder(image_size=32):
    """The tiny CLIP vision encoder and processor of the diffusers image-to-video tests."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        CLIPVisionModelWithProjection,
    )

    encoder = CLIPVisionModelWithProjection(CLIPVisionConfig(
        hidden_size=4, projection_dim=4, num_hidden_layers=2, num_attention_heads=2,
        image_size=image_size, intermediate_size=16, patch_size=1))
    return encoder, CLIPImageProcessor(crop_size=image_size, size=image_size)


def evaluated(*modules):
    for module in modules:
        if isinstance(module, torch.nn.Module):
            module.eval()
