"""Wan's VAE decode: whole (one compiled call), or latent frame by latent frame as a
stream (each chunk of frames on the host as soon as the VAE has made it).

Wan's decoder is causal in time: it runs once per latent frame (the first makes one
frame, each later one four), each call reading and replacing its causal convolutions'
cached frames. ``decode_chunk`` is one such call with the cache as its argument and
result (``chunk_scan.Cache``), compiled as a method of the VAE: a program for the
first frame, one for each call while the cache fills, then the same one for every
later frame, so the number of programs does not grow with the video.
"""

from __future__ import annotations

import torch

from porter.families import decoded_frames
from porter.shims.interop import to_host
from porter.transforms import jit
from porter.transforms.jit.chunk_scan import Cache, one_ahead
from porter_wan import i2v


def denormalized(vae, latents):
    """The pipeline's latents as the VAE takes them (its per-channel statistics)."""
    mean, inv_std = i2v.latent_stats(vae, vae.dtype)
    return latents.to(vae.dtype) / inv_std + mean


def decode_chunk(vae, z, cache: Cache, first: bool):
    """One latent frame ``z`` (batch, channels, 1, height, width) decoded, as
    ``AutoencoderKLWan._decode`` decodes each: (pixels, the cache after it)."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

    entries = list(cache)
    extra = {"first_chunk": True} if first else {}
    out = vae.decoder(vae.post_quant_conv(z), feat_cache=entries, feat_idx=[0], **extra)
    if vae.config.patch_size is not None:
        out = unpatchify(out, patch_size=vae.config.patch_size)
    return torch.clamp(out, min=-1.0, max=1.0), Cache(entries)


def empty_cache(vae) -> Cache:
    """The cache the first latent frame's call starts from: an empty slot for each of
    the decoder's causal convolutions."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

    return Cache([None] * sum(isinstance(m, WanCausalConv3d) for m in vae.decoder.modules()))


def tiles(vae, height: int, width: int) -> bool:
    """Does the VAE decode latents of this size tile by tile (``enable_tiling`` and a
    size over its tile), as diffusers' ``_decode`` asks?"""
    ratio = vae.spatial_compression_ratio
    return bool(vae.use_tiling) and (width > vae.tile_sample_min_width // ratio
                                     or height > vae.tile_sample_min_height // ratio)


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
    step = jit.method(vae, "decode_chunk", decode_chunk)

    def calls():
        cache = empty_cache(vae)
        for index in range(z.shape[2]):
            # sliced on the host: an eager slice on the device would compile one small
            # program per index
            out, cache = step(z[:, :, index:index + 1].to("jax"), cache, first=index == 0)
            yield out

    for out in one_ahead(calls()):
        yield decoded_frames(pipe, to_host(out))
