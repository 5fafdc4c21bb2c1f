"""A tiny random LTX-Video pipeline (configs as in diffusers' own LTX tests)."""

import torch


def build_ltx_pipeline():
    from diffusers import (
        AutoencoderKLLTXVideo,
        FlowMatchEulerDiscreteScheduler,
        LTXPipeline,
        LTXVideoTransformer3DModel,
    )
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = LTXVideoTransformer3DModel(
            in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=4,
            attention_head_dim=8, cross_attention_dim=32, num_layers=1, caption_channels=32)
        four, five = (False,) * 4, (1,) * 5
        vae = AutoencoderKLLTXVideo(
            in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8,) * 4,
            decoder_block_out_channels=(8,) * 4, layers_per_block=five,
            decoder_layers_per_block=five, spatio_temporal_scaling=(True, True, False, False),
            decoder_spatio_temporal_scaling=(True, True, False, False),
            decoder_inject_noise=(False,) * 5, upsample_residual=four, upsample_factor=(1,) * 4,
            timestep_conditioning=False, patch_size=1, patch_size_t=1, encoder_causal=True,
            decoder_causal=False)
        text_encoder = T5EncoderModel(T5Config(
            vocab_size=384, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
            relative_attention_num_buckets=8))
    for module in (transformer, vae, text_encoder):
        module.eval()
    return LTXPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae,
                       text_encoder=text_encoder, tokenizer=ByT5Tokenizer(),
                       transformer=transformer)
