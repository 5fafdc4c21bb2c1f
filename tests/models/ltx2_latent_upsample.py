"""A tiny random LTX2LatentUpsamplePipeline: the tiny LTX-2 VAE (diffusers' LTX-2 tests)
and an LTX-2 latent upsampler at the widths of the LTX-Video upsampler's test (diffusers
has no test of this pipeline)."""

import torch


def build_ltx2_latent_upsample_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(video=<9 frames of 32x32>, height=32,
    # width=32, num_frames=9, output_type="np") gives finite frames of 64x64.
    from diffusers import LTX2LatentUpsamplePipeline
    from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel

    from models.ltx2 import ltx2_components

    vae = ltx2_components()["vae"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        upsampler = LTX2LatentUpsamplerModel(in_channels=4, mid_channels=32,
                                             num_blocks_per_stage=1, dims=3,
                                             spatial_upsample=True, temporal_upsample=False)
    return LTX2LatentUpsamplePipeline(vae=vae, latent_upsampler=upsampler.eval())
