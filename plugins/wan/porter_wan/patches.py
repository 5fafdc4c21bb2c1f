"""Wan-specific patches, usable outside Porter in a ``with`` block."""

from __future__ import annotations

from porter.patches import Patch
from porter.transforms import rotary


def _cached_rope_forward(original):
    def forward(self, hidden_states):
        # Keyed by the latent grid (frames, height, width): batch does not matter.
        tables = rotary.lookup(self, tuple(hidden_states.shape[2:]))
        return tables if tables is not None else original(self, hidden_states)
    forward.__doc__ = original.__doc__
    return forward


ROPE_CACHE = Patch(
    name="wan.rope_cache",
    target="diffusers.models.transformers.transformer_wan:WanRotaryPosEmbed.forward",
    doc="Serve Wan's rotary (cos, sin) tables from a cache filled on the host for the "
        "recipe's latent shape (recipe: rotary.precompute: true); shapes not in the cache "
        "fall back to the original computation.",
    replacement=_cached_rope_forward,
    fits="diffusers>=0.33",
)
