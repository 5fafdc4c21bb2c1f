"""Wan-specific patches, usable outside Porter in a ``with`` block."""

from __future__ import annotations

from porter.patches import Patch
from porter.transforms import rotary


ROPE_CACHE = Patch(
    name="wan.rope_cache",
    target="diffusers.models.transformers.transformer_wan:WanRotaryPosEmbed.forward",
    doc="Serve Wan's rotary (cos, sin) tables from a cache filled on the host for the "
        "recipe's latent shape (recipe: rotary.precompute: true); shapes not in the cache "
        "fall back to the original computation.",
    replacement=rotary.cached_forward,
    fits="diffusers>=0.33,<0.43",
)
