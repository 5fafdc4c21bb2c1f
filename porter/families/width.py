"""The residual of a Wan-style transformer split along its width under ``tp``.

``tp`` splits a block's matmuls over the chips (Megatron's split of the weights) and
leaves every chip the whole tokens: each chip normalizes, modulates and adds all of
them, and each block's outputs are all-reduced in full. Where a pipeline's transformer
modulates by token (a timestep a frame, or the history's apart from the chunk's:
SkyReels-V2's diffusion forcing, AnyFlow FAR, Helios), those float32 modulations are
the size of the tokens too, whole on every chip. Split along the width over the head
axis, each chip works on its share of it; where the weights are split over that axis
as Megatron splits them, the matmuls' inputs are gathered and their sums arrive split
(the same sums; XLA chooses the collectives). The generic family gives the split by
default to the pipelines whose transformer has Wan's blocks (``PIPELINES``,
``default_activations``). On v6e-8: a 3-frame call of FAR 14B bounds at 0.076 s
instead of 0.113, a call of a SkyReels-V2 DF 14B window at 0.55 s instead of 2.20,
Helios's largest pyramid stage at 0.126 s instead of 0.497 (benchmarks/README.md).
Wan's own transformer modulates by sample: its bound moves 3% (set by its FLOPs), but
its norms' reductions over the whole width were a quarter of a block's cycles by the
TPU compiler's estimate, so the Wan family splits its transformers' residual too, and
the generic family Wan's pipelines and those built on Wan's transformer, both where the
heads divide the axis (``residual_split``): two 14B blocks at 720p, 218 M cycles
to 179 M, for 3.1 GB more a chip between chips (none more where the weights are split
over both axes, as Wan 2.2 A14B's are)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from porter.recipe.schema import ActivationRule

if TYPE_CHECKING:
    from porter.recipe import Recipe

#: the modules whose outputs a block adds to its residual (batch, tokens, width):
#: the self-attention's projection out, the cross-attention, the feed-forward layers
#: (the names of diffusers' Wan blocks, and of the blocks built on them)
WIDTH_BLOCKS = r"blocks\.\d+\.(attn1\.to_out\.0|attn2|ffn)"
#: the pipelines (and those built on them) whose transformer has Wan's blocks: those
#: that modulate by frame, and Wan's own run by the generic family (its recipes on
#: ``recipes/wan-generic-base.yaml``), split as the Wan family splits them (where the
#: heads divide the axis). Diffusers' modular Wan pipelines are not classes of these:
#: not split
PIPELINES = ("AnyFlowFARPipeline", "HeliosPipeline", "HeliosPyramidPipeline",
             "SkyReelsV2DiffusionForcingPipeline",
             "SkyReelsV2DiffusionForcingImageToVideoPipeline",
             "SkyReelsV2DiffusionForcingVideoToVideoPipeline",
             "WanPipeline", "WanImageToVideoPipeline", "WanVideoToVideoPipeline",
             "WanVACEPipeline", "LucyEditPipeline", "ChronoEditPipeline",
             "WanAnimatePipeline", "SkyReelsV2Pipeline", "SkyReelsV2ImageToVideoPipeline")


def splits(cls) -> bool:
    """Is pipeline class ``cls`` one whose transformer's residual is split (``PIPELINES``,
    or built on one)?"""
    return any(base.__name__ in PIPELINES for base in cls.__mro__)


def residual_axes(recipe: Recipe, axes: dict) -> tuple[str | None, str] | None:
    """(the batch's axis, the width's) a Wan-style residual is split over: attention's
    head axis where it has more than one device, the batch on attention's data axis (as
    attention's kernel holds it); None where the head axis splits nothing."""
    axis = recipe.attention.head_axis
    if axis is None or axes.get(axis, 1) == 1:
        return None
    return recipe.attention.batch_axis(axes), axis


def split_axes(recipe: Recipe, cls, axes: dict) -> tuple[str | None, str] | None:
    """``residual_axes`` for pipeline ``cls``'s transformer: None where it is not split
    (another pipeline, or not known before loading: a hub id without
    ``model.pipeline``)."""
    return residual_axes(recipe, axes) if cls is not None and splits(cls) else None


def heads_of(config) -> int | None:
    """A transformer configuration's attention heads (``num_attention_heads``: a
    diffusers configuration's key or a transformers one's attribute), or None (no
    configuration, or none said)."""
    heads = config.get("num_attention_heads") if isinstance(config, Mapping) \
        else getattr(config, "num_attention_heads", None)
    return heads if isinstance(heads, int) else None


def residual_split(recipe: Recipe, axes: dict, heads: int | None = None) -> list:
    """The activation rule that splits a Wan-style residual (``residual_axes``), or
    none: what the Wan family gives each of its transformers. None either where the
    transformer's ``heads`` (when known) do not divide the axis: attention then splits
    the tokens over it, and the width would be gathered around every attention (Wan
    1.3B's 12 heads over v6e-8's tp=8: twice the bytes between chips, none of the
    bound; benchmarks/README.md)."""
    found = residual_axes(recipe, axes)
    if found is None:
        return []
    batch, width = found
    size = axes.get(width)
    if heads is not None and isinstance(size, int) and heads % size:
        return []
    return [ActivationRule(module=WIDTH_BLOCKS, spec=[batch, None, width])]


def width_split(recipe: Recipe, cls, axes: dict, heads: int | None = None) -> list:
    """``residual_split`` for pipeline ``cls``'s transformer (``splits``), or none."""
    return residual_split(recipe, axes, heads) if cls is not None and splits(cls) else []
