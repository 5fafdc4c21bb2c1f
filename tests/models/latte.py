"""A tiny random Latte pipeline (configs as in diffusers' own Latte tests; the hub's
tiny-random-t5 text encoder is rebuilt from its config in code, with a ByT5 tokenizer)."""

import torch


def build_latte_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=8, width=8, video_length=1,
    # num_inference_steps=2, guidance_scale=5.0, clean_caption=False, output_type="np") gives
    # 1 finite 8x8 frame; the prompt is always padded to 120 tokens (no max_sequence_length).
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        LattePipeline,
        LatteTransformer3DModel,
    )
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = LatteTransformer3DModel(
            sample_size=8, num_layers=1, patch_size=2, attention_head_dim=8,
            num_attention_heads=3, caption_channels=32, in_channels=4, cross_attention_dim=24,
            out_channels=8, attention_bias=True, activation_fn="gelu-approximate",
            num_embeds_ada_norm=1000, norm_type="ada_norm_single",
            norm_elementwise_affine=False, norm_eps=1e-6)
        torch.manual_seed(0)
        vae = AutoencoderKL()
        text_encoder = T5EncoderModel(T5Config(  # hf-internal-testing/tiny-random-t5
            vocab_size=1103, d_model=32, d_kv=8, d_ff=37, num_layers=5, num_heads=4,
            relative_attention_num_buckets=8, initializer_factor=0.002))
    for module in (transformer, vae, text_encoder):
        module.eval()
    return LattePipeline(tokenizer=ByT5Tokenizer(), text_encoder=text_encoder, vae=vae,
                         transformer=transformer, scheduler=DDIMScheduler())
