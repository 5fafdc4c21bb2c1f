"""CogVideoX's VAE decode as a stream: its latent frames in the batches diffusers'
``AutoencoderKLCogVideoX._decode`` takes (the first with the frames that do not make
a whole batch, then two at a time), each batch's frames on the host as soon as the
VAE has made them. The batches carry the causal convolutions' cache from one to the
next; ``decode_chunk`` is one batch with that cache as its argument and result,
compiled as a method of the VAE: a program for the first batch (no cache yet), one for
the batches after it, whatever the video's length."""

from __future__ import annotations

from porter.families import decoded_frames
from porter.families.base import compiled_function
from porter.shims.carried import one_ahead
from porter.shims.interop import to_host


def decode_chunk(vae, z, cache):
    """One batch of latent frames ``z`` decoded: (pixels, the cache after it)."""
    if vae.post_quant_conv is not None:
        z = vae.post_quant_conv(z)
    return vae.decoder(z, conv_cache=cache)


def batches(frames: int, size: int) -> list[tuple[int, int]]:
    """(start, end) of each batch of latent frames, as ``_decode`` takes them (fewer
    frames than a batch: all of them)."""
    count, rest = max(frames // size, 1), frames % size
    return [(size * i + (0 if i == 0 else rest), min(size * (i + 1) + rest, frames))
            for i in range(count)]


def tiles(vae, height: int, width: int) -> bool:
    """Does the VAE decode latents of this size tile by tile, as ``_decode`` asks?"""
    return bool(vae.use_tiling) and (width > vae.tile_latent_min_width
                                     or height > vae.tile_latent_min_height)


def chunks(pipe, latents):
    """The decode of ``latents`` (batch, frames, channels, height, width: the pipeline's
    layout) batch by batch, as uint8 frames; the next batch dispatched before this one
    is brought to the host. A tiled decode's frames come as one chunk."""
    vae = pipe.vae
    # as the pipeline's decode_latents scales them (1 / factor first: the same rounding)
    z = 1 / pipe.vae_scaling_factor_image * latents.permute(0, 2, 1, 3, 4)
    if tiles(vae, *z.shape[-2:]):
        yield decoded_frames(pipe, to_host(vae.decode(z.to("jax")).sample))
        return
    step = compiled_function(vae, "decode_chunk", decode_chunk)

    def calls():
        cache = None  # the first batch's call starts with none
        for start, end in batches(z.shape[2], vae.num_latent_frames_batch_size):
            out, cache = step(z[:, :, start:end].to("jax"), cache)
            yield out

    for out in one_ahead(calls()):
        yield decoded_frames(pipe, to_host(out))
