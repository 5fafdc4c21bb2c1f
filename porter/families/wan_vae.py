"""Wan's VAE (``AutoencoderKLWan``) decoding latent frame by latent frame: the Wan
family's streamed decode, and the generic family's for the pipelines built on Wan's
VAE that finish their video chunk by chunk (``porter.families.chunked``).

Wan's decoder is causal in time: ``AutoencoderKLWan._decode`` runs it once per latent
frame (the first makes one frame, each later one four), each call reading and
replacing its causal convolutions' cached frames. ``decode_chunk`` is one such call
with the cache as its argument and result (``Cache``), compiled as a method of the VAE
where the VAE is compiled (a family's ``compiled_functions``): a program for the first
frame, one for each call while the cache fills, then the same one for every later
frame, so the number of programs does not grow with the video. Frames decoded so are
the whole decode's, exactly.
"""

from __future__ import annotations

from porter.families.base import compiled_function
from porter.shims import lazy
from porter.shims.carried import Cache
from porter.shims.interop import unwrapped

torch = lazy.module("torch", __name__)


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


def is_wan_vae(vae) -> bool:
    """Is ``vae`` Wan's (or built on it), whose decode this module repeats? Asked of
    the module behind a port's wrappers."""
    return any(cls.__name__ == "AutoencoderKLWan" for cls in type(unwrapped(vae)).__mro__)


def tiles(vae, height: int, width: int) -> bool:
    """Does the VAE decode latents of this size tile by tile (``enable_tiling`` and a
    size over its tile), as diffusers' ``_decode`` asks? Then it has no frame order."""
    if not vae.use_tiling:
        return False
    ratio = vae.spatial_compression_ratio
    return width > vae.tile_sample_min_width // ratio \
        or height > vae.tile_sample_min_height // ratio


class FrameByFrame:
    """A video's latent frames decoded as they come, in order, over as many calls as
    the caller likes: the causal cache carried from each call to the next, so the
    pixels together are the whole decode's. ``vae.decode_chunk`` where the VAE is
    compiled (a program per cache signature), else the same function run eagerly."""

    def __init__(self, vae):
        self.cache = empty_cache(vae)
        self.count = 0  # latent frames decoded so far
        # a port's VAE takes JAX tensors; an abstract one (porter compile's run of the
        # pipeline on shapes alone) meta tensors. (A torchax tensor says is_meta too:
        # it is a wrapper made on the meta device; its device type says jax.)
        weight = next(unwrapped(vae).parameters(), None)
        self.device = "meta" if weight is not None and weight.device.type == "meta" \
            else "jax"
        self.step = compiled_function(vae, "decode_chunk", decode_chunk)

    def __call__(self, z):
        """The pixels of each latent frame of ``z`` (a host tensor, batch, channels,
        frames, height, width: the next frames of the video), one device tensor each,
        each dispatched as the one before it is handed on."""
        for index in range(z.shape[2]):
            # sliced on the host: an eager slice on the device would compile one small
            # program per index
            out, self.cache = self.step(z[:, :, index:index + 1].to(self.device), self.cache,
                                        first=self.count == 0)
            self.count += 1
            yield out
