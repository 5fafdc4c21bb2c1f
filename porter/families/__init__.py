"""What a model family is to the core, and what a plugin subclasses: ``ModelFamily``
(``base``: what every family declares), ``StagedFamily`` and ``Grid`` (``staged``: the
steps the core's loop drives), ``GenericFamily`` (``generic``: any diffusers pipeline,
run by its own loop); and what every family's guidance comes to (``guided``,
``batch``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from porter.families.base import ModelFamily, decoded_frames
from porter.families.generic import GenericFamily
from porter.families.staged import Grid, StagedFamily, from_the_start

if TYPE_CHECKING:
    from porter.recipe import Recipe

__all__ = ["GenericFamily", "Grid", "ModelFamily", "StagedFamily", "batch",
           "decoded_frames", "from_the_start", "guided"]


def guided(family: ModelFamily, recipe: Recipe) -> bool:
    """Whether the recipe asks for classifier-free guidance (two branches)."""
    return family.cfg_scale(recipe) > 1.0


def batch(family: ModelFamily, recipe: Recipe) -> int:
    """The transformer's batch: 2 when both branches run as one call."""
    return 2 if recipe.generate.cfg_parallel and guided(family, recipe) else 1
