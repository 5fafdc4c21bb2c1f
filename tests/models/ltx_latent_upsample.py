"""A tiny random LTXLatentUpsamplePipeline: the tiny LTX-Video VAE and the latent
upsampler of diffusers' own test (tests/pipelines/ltx/test_ltx_latent_upsample.py)."""

import torch


def build_ltx_latent_upsample_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(video=<5 frames of 32x32>, height=16,
    # width=16, output_type="np") gives 5 finite frames of 32x32.
    from diffusers import LTXLatentUpsamplePipeline
    from diffusers.pipelines.ltx.modeling_latent_upsampler import LTXLatentUpsamplerModel

    from models.ltx import build_ltx_pipeline

    vae = build_ltx_pipeline().vae
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        upsampler = LTXLatentUpsamplerModel(in_channels=8, mid_channels=32,
                                            num_blocks_per_stage=1, dims=3,
                                            spatial_upsample=True, temporal_upsample=False)
    return LTXLatentUpsamplePipeline(vae=vae, latent_upsampler=upsampler.eval())
