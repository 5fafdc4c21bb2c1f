"""A tiny random LTX-2.5 modular pipeline: the LTX-2 test's components (models.ltx2) and
the diffusion decoder of the LTX-2 diffusion-decode test (models.ltx2_diffusion_decode),
sized to the tiny VAE's four latent channels, under LTX25ModularPipeline. The VAE takes
patches of 2 (latents 4x smaller than the frames asked for): the decoder makes frames 16x
its latents, and its neighbourhood attention, which Porter runs dense, grows with the
square of their pixels. Saved as a
modular checkpoint (no classic pipeline holds a diffusion decoder beside a VAE)."""

import torch


def build_ltx25_pipeline():
    from diffusers import LTX25ModularPipeline, LTX2VideoDiffusionDecoderModel

    from models.ltx2 import ltx2_components
    from models.ltx2_diffusion_decode import DECODER_CONFIG

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        decoder = LTX2VideoDiffusionDecoderModel(
            **{**DECODER_CONFIG, "latent_channels": 4}).eval()
        components = ltx2_components()
        torch.manual_seed(0)  # the tiny VAE in patches of 2: 4x smaller latents
        vae = type(components["vae"])(**{**components["vae"].config, "patch_size": 2}).eval()
    vae.use_framewise_encoding = vae.use_framewise_decoding = False
    pipe = LTX25ModularPipeline()
    pipe.update_components(**{**components, "vae": vae}, diffusion_decoder=decoder)
    return pipe
