"""Wan's VAE decoder run on its feature maps cut into row blocks, batched: the form a
TPU's compiler convolves without padding and folding them (benchmarks/README.md,
"Where a latent frame's decode goes").

Given a convolution over a batch of one, the TPU compiler pads the width and folds it
into a batch to fill its tiles, and copies the result back: over half of each
convolution's cycles. Given the same rows as 8 blocks in the batch (it tiles a
convolution's batch by 8) it does neither: one causal convolution of the decoder's
last stage at 480x832, split over width across a v6e-8, costs 1.73 M cycles instead of
3.39 M (``python benchmarks/conv_forms.py``). The whole decode of a later latent frame
of Wan 2.1 1.3B there: 24.2 M cycles instead of 52.8 M (``porter compile ... --hlo``).

So the decoder takes its input as ``BLOCKS`` blocks of rows, block-major in the batch
(``to_blocks``), and keeps them so to its output (``from_blocks``). Every operation of
Wan's decoder is per pixel, per frame or a nearest upsampling (which maps each block's
rows onto the same block; ``doubled`` writes it in one pass) but two, patched here:

- each convolution with a spatial kernel (``WanCausalConv3d``, the upsamplers'
  ``Conv2d``) takes the rows above and below each block from its neighbours, zeros at
  the image's edges (``with_halo``), where it would have padded with zeros;
- the middle block's attention, over a whole frame's pixels, runs on the frame put
  back together (``whole_frames``).

Rows that do not divide into the blocks are padded at the bottom and cut off at the
end; a convolution reads them as zeros (only a convolution reads across rows, so what
they hold otherwise never reaches the image's rows). Every causal convolution with a
spatial kernel reads a norm's output (after its SiLU) or the latents, so the norms
zero the padding rows as they write them (``zeroing_norm``), in the pass that
computes them; the upsamplers' convolutions, which read the residual stream upsampled,
zero it themselves. A select of its own before each convolution, over the maps joined
with the cached frames, cost 4.5 M of a later 480p frame's 29.4 M cycles. The causal
cache holds what the convolutions read, in blocks too: a video decodes in blocks from
its first latent frame to its last. The pixels are the decode's within float rounding
(tests/families/test_row_blocks.py).
"""

from __future__ import annotations

import types
from dataclasses import dataclass

from porter.shims import lazy

torch = lazy.module("torch", __name__)

#: the blocks a frame's rows are cut into: a TPU tiles a convolution's batch by 8. One
#: convolution at 480x832 split over a v6e-8's width (3.39 M cycles whole): 2, 4 and 6
#: blocks 4.54, 5.59 and 4.97 M (the compiler folds the width again), 8 blocks 1.73,
#: 12 blocks 2.64 (``conv_forms.py --forms blocks-split-width --blocks N``)
BLOCKS = 8


@dataclass(frozen=True)
class Layout:
    """How the decoder's input rows are cut: ``blocks`` blocks of ``block_rows`` rows,
    of which the first ``rows`` are the image's (the rest padding, at the bottom)."""

    blocks: int
    rows: int
    block_rows: int

    @classmethod
    def of(cls, rows: int, blocks: int = BLOCKS) -> Layout:
        return cls(blocks, rows, -(-rows // blocks))

    def image_rows(self, block_rows: int) -> int:
        """The image's rows where the maps have ``block_rows`` rows a block (the input's
        times an upsampling's factor): the rest are padding."""
        return self.rows * (block_rows // self.block_rows)


def to_blocks(x, layout: Layout):
    """(batch, channels, frames, rows, width) -> (blocks x batch, channels, frames,
    block rows, width), block-major, the rows padded with zeros to fill the blocks."""
    batch, channels, frames, rows, width = x.shape
    block = layout.block_rows * (rows // layout.rows)  # an upsampling's factor on
    if block * layout.blocks > rows:
        x = torch.nn.functional.pad(x, (0, 0, 0, block * layout.blocks - rows))
    x = x.reshape(batch, channels, frames, layout.blocks, block, width)
    return x.permute(3, 0, 1, 2, 4, 5).reshape(layout.blocks * batch, channels, frames,
                                                block, width)


def from_blocks(x, layout: Layout):
    """``to_blocks`` undone: (batch, channels, frames, rows, width), the padding rows cut
    off."""
    count, channels, frames, block, width = x.shape
    batch = count // layout.blocks
    x = x.reshape(layout.blocks, batch, channels, frames, block, width)
    x = x.permute(1, 2, 3, 0, 4, 5).reshape(batch, channels, frames,
                                            layout.blocks * block, width)
    return x[:, :, :, :layout.image_rows(block)]


def with_halo(x, layout: Layout, halo: int):
    """Maps in blocks (blocks x n, ..., block rows, width), their padding rows zero, with
    ``halo`` rows of the blocks above and below on each (zeros above the first and
    below the last): what zero padding of the whole image's rows gives each block's
    convolution. Block ``i``'s neighbours are ``n`` entries away in the batch: shifted
    so, not reshaped (a reshape to (blocks, n, ...) costs the TPU compiler a copy of
    the maps, about a convolution's cycles)."""
    n = x.shape[0] // layout.blocks
    edge = torch.zeros_like(x[:n, ..., :halo, :])
    above = torch.cat([edge, x[:-n, ..., -halo:, :]])
    below = torch.cat([x[n:, ..., :halo, :], edge])
    return torch.cat([above, x, below], dim=-2)


def padding_zeroed(x, layout: Layout):
    """Maps in blocks with their padding rows (those past the image's last) set to zero:
    one select over them all, which the compiler fuses into what made them (a select
    of the last blocks alone, then joined on, costs a pass of its own)."""
    n = x.shape[0] // layout.blocks
    rows = x.shape[-2]
    image_rows = layout.image_rows(rows)
    if image_rows == layout.blocks * rows:
        return x
    block = torch.arange(x.shape[0], device=x.device) // n
    row = block.reshape(-1, 1) * rows + torch.arange(rows, device=x.device)
    kept = (row < image_rows).reshape(x.shape[0], *[1] * (x.ndim - 3), rows, 1)
    return torch.where(kept, x, torch.zeros((), dtype=x.dtype, device=x.device))


class Blocked:
    """The decoder's call in progress: its ``Layout`` while it runs (None between
    calls), read by the convolutions and the attention it patches."""

    def __init__(self):
        self.layout: Layout | None = None


# Each patched module runs its class's own forward when no decoder call is in progress
# (a module called by itself: a piece compiled on its own, a test): whole maps then.
# Bound to the module (MethodType), so that a copy of the module is bound to the copy.

def causal_conv(conv, blocked: Blocked):
    """``WanCausalConv3d.forward`` on maps in blocks: its row padding taken from the
    neighbouring blocks (``with_halo``), its width and time padding as it pads them."""
    def forward(self, x, cache_x=None):
        if blocked.layout is None:
            return type(self).forward(self, x, cache_x)
        padding = list(self._padding)  # (width, width, rows, rows, frames before, after)
        if cache_x is not None and padding[4] > 0:
            x = torch.cat([cache_x.to(x.device), x], dim=2)
            padding[4] -= cache_x.shape[2]
        if padding[2]:
            x = with_halo(x, blocked.layout, padding[2])
            padding[2] = padding[3] = 0
        x = torch.nn.functional.pad(x, padding)
        return torch.nn.Conv3d.forward(self, x)
    return types.MethodType(forward, conv)


def image_conv(conv, blocked: Blocked):
    """An upsampler's ``Conv2d`` (frames in the batch: blocks x batch x frames,
    channels, rows, width) on maps in blocks, its row padding from the neighbours."""
    def forward(self, x):
        if blocked.layout is None:
            return type(self).forward(self, x)
        x = with_halo(padding_zeroed(x, blocked.layout), blocked.layout, self.padding[0])
        return torch.nn.functional.conv2d(x, self.weight, self.bias, self.stride,
                                          (0, self.padding[1]), self.dilation, self.groups)
    return types.MethodType(forward, conv)


def zeroing_norm(norm, blocked: Blocked):
    """A ``WanRMS_norm`` on maps in blocks, its padding rows written as zeros: the
    select fuses into the norm's own pass, and the SiLU after it keeps them zero for
    the convolution that reads them."""
    def forward(self, x):
        out = type(self).forward(self, x)
        return out if blocked.layout is None else padding_zeroed(out, blocked.layout)
    return types.MethodType(forward, norm)


def doubled(upsample, blocked: Blocked):
    """A ``WanUpsample`` (nearest, twice the rows and columns) on maps in blocks, each
    pixel broadcast to its 2 x 2 square in one pass. Torch's nearest upsampling lowers
    to a broadcast of the rows and then one of the columns, each a pass over its output:
    2.44 M cycles of a later 480p frame against 1.66 M in one. Exact in any dtype, so
    without the float32 round trip."""
    def forward(self, x):
        if blocked.layout is None:
            return type(self).forward(self, x)
        count, channels, rows, width = x.shape
        return x[:, :, :, None, :, None].expand(count, channels, rows, 2, width, 2) \
            .reshape(count, channels, 2 * rows, 2 * width)
    return types.MethodType(forward, upsample)


def whole_frames(module, blocked: Blocked):
    """A module over whole frames (the middle block's attention) given maps in blocks:
    the frames put back together for it, its output cut into blocks again. The layout
    is cleared while it runs, so that the patched modules inside it (its norm) take
    whole frames as whole frames."""
    def forward(self, x):
        layout = blocked.layout
        if layout is None:
            return type(self).forward(self, x)
        blocked.layout = None
        try:
            whole = type(self).forward(self, from_blocks(x, layout))
        finally:
            blocked.layout = layout
        return to_blocks(whole, layout)
    return types.MethodType(forward, module)


def decoder_call(decoder, blocked: Blocked):
    """``WanDecoder3d.forward`` given whole maps and giving them back: the latent frames
    cut into blocks, the decoder run on them, its pixels put back together."""
    def forward(self, x, *args, **kwargs):
        blocked.layout = layout = Layout.of(x.shape[-2])
        try:
            return from_blocks(type(self).forward(self, to_blocks(x, layout), *args,
                                                  **kwargs), layout)
        finally:
            blocked.layout = None
    return types.MethodType(forward, decoder)


def keep_in_blocks(vae) -> bool:
    """Patch ``vae`` (Wan's, or built on it) so that its decoder runs on row blocks
    (once: True again for a VAE already patched); False where its decoder is not one
    this module knows (nothing patched)."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import (
        WanAttentionBlock, WanCausalConv3d, WanDecoder3d, WanResample, WanRMS_norm)

    decoder = getattr(vae, "decoder", None)
    if not isinstance(decoder, WanDecoder3d):
        return False
    if getattr(decoder, "_row_blocks", None) is not None:
        return True
    blocked = Blocked()
    for module in decoder.modules():
        if isinstance(module, WanCausalConv3d):
            module.forward = causal_conv(module, blocked)
        elif isinstance(module, WanAttentionBlock):
            module.forward = whole_frames(module, blocked)
        elif isinstance(module, WanRMS_norm):
            module.forward = zeroing_norm(module, blocked)
        elif isinstance(module, WanResample) and module.mode.startswith("upsample"):
            module.resample[1].forward = image_conv(module.resample[1], blocked)
            upsample = module.resample[0]
            scale = upsample.scale_factor  # a float, or one a dimension
            factors = tuple(scale) if isinstance(scale, (tuple, list)) else (scale, scale)
            if upsample.mode in ("nearest", "nearest-exact") and factors == (2.0, 2.0):
                upsample.forward = doubled(upsample, blocked)
    decoder.forward = decoder_call(decoder, blocked)
    decoder._row_blocks = blocked
    return True
