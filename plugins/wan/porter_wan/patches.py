"""Wan-specific patches, usable outside Porter in a ``with`` block."""

from __future__ import annotations

from porter.transforms import rotary
from porter.transforms.patches import Patch

ROPE_CACHE = Patch(
    name="wan.rope_cache",
    target="diffusers.models.transformers.transformer_wan:WanRotaryPosEmbed.forward",
    doc="Serve Wan's rotary (cos, sin) tables from a cache filled on the host for the "
        "recipe's latent shape (recipe: rotary.precompute: true); shapes not in the cache "
        "fall back to the original computation.",
    replacement=rotary.cached_forward,
    fits="diffusers>=0.33,<0.43",
)


def _tiled(vae, height: int, width: int, min_height: int, min_width: int) -> bool:
    """diffusers' own test for a tiled decode or encode (its own loop over tiles)."""
    return vae.use_tiling and (width > min_width or height > min_height)


def scanned_decode(original, **_):
    """``AutoencoderKLWan._decode`` with its loop over latent frames as
    ``chunk_scan.run``: diffusers' own code otherwise (tiled decodes, plain PyTorch
    tensors: the original)."""

    def _decode(self, z, return_dict: bool = True):
        import torch
        from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify
        from diffusers.models.autoencoders.vae import DecoderOutput

        from porter.transforms.jit import chunk_scan

        _, _, frames, height, width = z.shape
        ratio = self.spatial_compression_ratio
        if not chunk_scan.on_jax([z]) or _tiled(self, height, width,
                                                self.tile_sample_min_height // ratio,
                                                self.tile_sample_min_width // ratio):
            return original(self, z, return_dict=return_dict)
        self.clear_cache()
        x = self.post_quant_conv(z)

        def step(frame, first: bool):
            self._conv_idx = [0]
            extra = {"first_chunk": True} if first else {}
            return self.decoder(frame, feat_cache=self._feat_map, feat_idx=self._conv_idx,
                                **extra)

        out = torch.cat(chunk_scan.run([x[:, :, i:i + 1] for i in range(frames)], step,
                                       self._feat_map), 2)
        if self.config.patch_size is not None:
            out = unpatchify(out, patch_size=self.config.patch_size)
        out = torch.clamp(out, min=-1.0, max=1.0)
        self.clear_cache()
        return DecoderOutput(sample=out) if return_dict else (out,)

    _decode.__doc__ = f"patched by porter: latent frames as one scan (was {original!r})"
    return _decode


def scanned_encode(original, **_):
    """``AutoencoderKLWan._encode`` with its loop over frame chunks (the first frame,
    then four at a time) as ``chunk_scan.run``."""

    def _encode(self, x):
        import torch
        from diffusers.models.autoencoders.autoencoder_kl_wan import patchify

        from porter.transforms.jit import chunk_scan

        _, _, frames, height, width = x.shape
        if not chunk_scan.on_jax([x]) or _tiled(self, height, width,
                                                self.tile_sample_min_height,
                                                self.tile_sample_min_width):
            return original(self, x)
        self.clear_cache()
        if self.config.patch_size is not None:
            x = patchify(x, patch_size=self.config.patch_size)
        pieces = [x[:, :, :1]] + [x[:, :, 1 + 4 * (i - 1):1 + 4 * i]
                                  for i in range(1, 1 + (frames - 1) // 4)]

        def step(piece, first: bool):  # diffusers' encoder has no first-chunk mode
            self._enc_conv_idx = [0]
            return self.encoder(piece, feat_cache=self._enc_feat_map,
                                feat_idx=self._enc_conv_idx)

        enc = self.quant_conv(torch.cat(chunk_scan.run(pieces, step, self._enc_feat_map), 2))
        self.clear_cache()
        return enc

    _encode.__doc__ = f"patched by porter: frame chunks as one scan (was {original!r})"
    return _encode


VAE_DECODE_SCAN = Patch(
    name="wan.vae_decode_scan",
    target="diffusers.models.autoencoders.autoencoder_kl_wan:AutoencoderKLWan._decode",
    doc="Wan's VAE decodes one latent frame per decoder call, each call reading and "
        "replacing the causal convolutions' cached frames: traced as written, a 720p "
        "decode is 21 copies of the decoder for the compiler. Once a call leaves the "
        "cache as it found it (shapes, dtypes: from the third frame on), the remaining "
        "frames run as one lax.scan carrying the cache (porter.transforms.jit.chunk_scan): "
        "the same values, four decoder copies to compile whatever the length. On JAX "
        "only; plain PyTorch and tiled decodes run diffusers' loop.",
    replacement=scanned_decode,
    fits="diffusers>=0.35,<0.43",  # patchify and patch_size came with Wan 2.2
)

VAE_ENCODE_SCAN = Patch(
    name="wan.vae_encode_scan",
    target="diffusers.models.autoencoders.autoencoder_kl_wan:AutoencoderKLWan._encode",
    doc="The same for Wan's VAE encode (the first frame, then four frames per encoder "
        "call): image-to-video's conditioning video encoded with the chunks after the "
        "cache settles as one lax.scan.",
    replacement=scanned_encode,
    fits="diffusers>=0.35,<0.43",
)
