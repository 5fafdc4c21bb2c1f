"""The residual of a Wan-style transformer split along its width under ``tp``.

``tp`` splits a block's matmuls over the chips (Megatron's split of the weights) and
leaves every chip the whole tokens: each chip normalizes, modulates and adds all of
them, and each block's outputs are all-reduced in full. Where a pipeline's transformer
modulates by token (a timestep a frame, or the history's apart from the chunk's:
SkyReels-V2's diffusion forcing, AnyFlow FAR, Helios), those float32 modulations are
the size of the tokens too, whole on every chip. Split along the width over the head
axis, each chip works on its share of it; where the weights are split over that axis
as Megatron splits them, the matmuls' inputs are gathered and their outputs
reduce-scattered instead of all-reduced (the same sums). The generic family gives the
split by default (``default_activations``). On v6e-8: a 3-frame call of FAR 14B bounds
at 0.076 s instead of 0.113, a call of a SkyReels-V2 DF 14B window at 0.55 s instead
of 2.20, Helios's largest pyramid stage at 0.126 s instead of 0.497
(benchmarks/README.md). Wan 2.1's transformer modulates by sample and gains 3% (a
4-block copy of the 14B): plain Wan's pipelines are left as they were (Wan 2.2 TI2V-5B
modulates by token, and is not measured split)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from porter.recipe.schema import ActivationRule

if TYPE_CHECKING:
    from porter.recipe import Recipe

#: the modules whose outputs a block adds to its residual (batch, tokens, width):
#: the self-attention's projection out, the cross-attention, the feed-forward layers
#: (the names of diffusers' Wan blocks, and of the blocks built on them)
WIDTH_BLOCKS = r"blocks\.\d+\.(attn1\.to_out\.0|attn2|ffn)"
#: the pipelines (and those built on them) whose transformer has Wan's blocks and
#: modulates by frame
PIPELINES = ("AnyFlowFARPipeline", "HeliosPipeline", "HeliosPyramidPipeline",
             "SkyReelsV2DiffusionForcingPipeline",
             "SkyReelsV2DiffusionForcingImageToVideoPipeline",
             "SkyReelsV2DiffusionForcingVideoToVideoPipeline")


def splits(cls) -> bool:
    """Is pipeline class ``cls`` one whose transformer's residual is split (``PIPELINES``,
    or built on one)?"""
    return any(base.__name__ in PIPELINES for base in cls.__mro__)


def split_axes(recipe: Recipe, cls, axes: dict) -> tuple[str | None, str] | None:
    """(the batch's axis, the width's) the residual of pipeline ``cls``'s transformer is
    split over: attention's head axis where it has more than one device, the batch on
    attention's data axis (as attention's kernel holds it); None where nothing splits
    (another pipeline, or not known before loading: a hub id without
    ``model.pipeline``)."""
    axis = recipe.attention.head_axis
    if cls is None or not splits(cls) or axis is None or axes.get(axis, 1) == 1:
        return None
    return recipe.attention.batch_axis(axes), axis


def width_split(recipe: Recipe, cls, axes: dict) -> list:
    """The activation rule that splits the residual (``split_axes``), or none."""
    found = split_axes(recipe, cls, axes)
    if found is None:
        return []
    batch, width = found
    return [ActivationRule(module=WIDTH_BLOCKS, spec=[batch, None, width])]
