"""A tiny random LTX2VideoDiffusionDecodePipeline: the diffusion decoder of diffusers' own
test (tests/pipelines/ltx2/test_ltx2_diffusion_decode.py, its latent statistics made
non-trivial as there) and no VAE."""

import torch

DECODER_CONFIG = {
    "out_channels": 3, "latent_channels": 8, "patch_size": 2, "decoder_head_dim": 16,
    "decoder_stage_channels": (64, 32, 16, 16, 16), "decoder_stage_depths": (1, 1, 1, 1, 2),
    "decoder_stage_kernels": ((3, 3, 3),) * 4,
    "decoder_upsample_strides": ((1, 2, 2), (2, 1, 1), (2, 2, 2), (2, 2, 2)),
    "decoder_upsample_channel_reductions": (2, 2, 1, 1), "decoder_stage5_kernel": (3, 3, 3),
    "decoder_t_emb_dim": 32, "spatial_compression_ratio": 16, "temporal_compression_ratio": 8,
}


def build_ltx2_diffusion_decode_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(<latents 1x8x2x3x3>, output_type="np")
    # gives 9 finite 48x48 frames.
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        LTX2VideoDiffusionDecodePipeline,
        LTX2VideoDiffusionDecoderModel,
    )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        decoder = LTX2VideoDiffusionDecoderModel(**DECODER_CONFIG).eval()
    with torch.no_grad():
        decoder.latents_mean.copy_(torch.linspace(-0.1, 0.1, 8))
        decoder.latents_std.copy_(torch.linspace(0.5, 1.5, 8))
    return LTX2VideoDiffusionDecodePipeline(diffusion_decoder=decoder,
                                            scheduler=FlowMatchEulerDiscreteScheduler())
