"""What a model family is to the core: ``ModelFamily`` and ``StagedFamily``
(``base``), the generic family that runs any diffusers pipeline by its own loop
(``generic``), and what every family's guidance comes to (``guided``, ``batch``)."""

from __future__ import annotations


def guided(family, recipe) -> bool:
    """Whether the recipe asks for classifier-free guidance (two branches)."""
    return family.cfg_scale(recipe) > 1.0


def batch(family, recipe) -> int:
    """The transformer's batch: 2 when both branches run as one call."""
    return 2 if recipe.generate.cfg_parallel and guided(family, recipe) else 1
