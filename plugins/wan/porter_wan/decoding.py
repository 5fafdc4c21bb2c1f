"""Wan's VAE decode: whole (one compiled call), or latent frame by latent frame as a
stream (each chunk of frames on the host as soon as the VAE has made it). The frame by
frame decode itself is the core's (``porter.families.wan_vae``: the generic family's
pipelines built on Wan's VAE stream with it too)."""

from __future__ import annotations

from porter.families import decoded_frames
from porter.families.wan_vae import FrameByFrame, decode_chunk, empty_cache, tiles
from porter.shims.carried import one_ahead
from porter.shims.interop import to_host
from porter_wan import i2v

__all__ = ["chunks", "decode_chunk", "denormalized", "empty_cache", "tiles"]


def denormalized(vae, latents):
    """The pipeline's latents as the VAE takes them (its per-channel statistics)."""
    mean, inv_std = i2v.latent_stats(vae, vae.dtype)
    return latents.to(vae.dtype) / inv_std + mean


def chunks(pipe, latents):
    """The decode's frames, chunk by chunk (uint8 arrays). Each chunk's program is
    dispatched before the one before it is brought to the host, so the device decodes
    the next while the caller encodes this one. A tiled decode (``vae.use_tiling`` at
    a size it tiles) has no such order: its frames come as one chunk."""
    vae = pipe.vae
    z = denormalized(vae, latents)
    if tiles(vae, *z.shape[-2:]):
        yield decoded_frames(pipe, to_host(vae.decode(z.to("jax"), return_dict=False)[0]))
        return
    for out in one_ahead(FrameByFrame(vae)(z)):
        yield decoded_frames(pipe, to_host(out))
