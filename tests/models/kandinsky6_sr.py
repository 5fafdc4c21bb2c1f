"""A tiny random Kandinsky 6 video super-resolution pipeline (diffusers has no test of it):
a one-block transformer whose NABLA attention sees an 8x8 token grid (its tile is 32 x 32
pixels, its VAE three levels deep: 4x spatial and 4x temporal compression), no latent
upscaler (the tiles are cut from the upscaled video)."""

import torch


def build_kandinsky6_sr_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(video=<5 frames of 32x32>,
    # resolution_scale=2, num_inference_steps=2, output_type="np") gives 5 finite 64x64
    # frames.
    from diffusers import FlowMatchEulerDiscreteScheduler, Kandinsky6SRPipeline
    from diffusers.models.autoencoders.autoencoder_kandinsky6_sr import Kandinsky6SRVAE
    from diffusers.models.transformers.transformer_kandinsky6_sr import (
        Kandinsky6SRTransformer3DModel,
    )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = Kandinsky6SRTransformer3DModel(
            in_visual_dim=4, out_visual_dim=4, time_dim=16, model_dim=32, ff_dim=64,
            num_visual_blocks=1, axes_dims=(4, 6, 6), tile_sizes=((32, 32),))
        vae = Kandinsky6SRVAE(latent_channels=4, encoder_block_out_channels=(8, 8, 8),
                              decoder_block_out_channels=(8, 8, 8), layers_per_block=1)
    return Kandinsky6SRPipeline(transformer=transformer.eval(), vae=vae.eval(),
                                scheduler=FlowMatchEulerDiscreteScheduler())
