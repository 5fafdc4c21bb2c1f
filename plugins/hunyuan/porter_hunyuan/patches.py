"""HunyuanVideo-specific patches, usable outside Porter in a ``with`` block."""

from __future__ import annotations

from porter.patches import Patch
from porter.transforms import rotary

ROPE_CACHE = Patch(
    name="hunyuan.rope_cache",
    target="diffusers.models.transformers.transformer_hunyuan_video:"
           "HunyuanVideoRotaryPosEmbed.forward",
    doc="HunyuanVideo builds its rotary tables inside forward (torch.arange + meshgrid on "
        "the device, every step). Serve them from tables built once on the host for the "
        "recipe's latent grid (recipe: rotary.precompute: true); other grids fall back.",
    replacement=rotary.cached_forward,
    fits="diffusers>=0.32,<0.43",
)

ROPE_CACHE_15 = Patch(
    name="hunyuan.rope_cache_15",
    target="diffusers.models.transformers.transformer_hunyuan_video15:"
           "HunyuanVideo15RotaryPosEmbed.forward",
    doc="The same for HunyuanVideo 1.5's rotary module.",
    replacement=rotary.cached_forward,
    fits="diffusers>=0.36,<0.43",
)
