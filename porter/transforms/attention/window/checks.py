"""What a recipe's ``attention.window`` may be, checked without weights: against the
backend, the family and the video's token grid (tiles that fit it, a window that skips
something, dense steps fewer than all)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from porter.transforms.attention.window.tiling import MAX_TILES, Tiling

if TYPE_CHECKING:
    from porter.errors import Problem
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe

WHERE = "attention.window"


def problems(recipe: Recipe, family: ModelFamily | None) -> list[Problem]:
    """Every problem of ``attention.window`` (none without one); ``family`` None: an
    unknown family (its own check says so)."""
    spec = recipe.attention.window
    if spec is None:
        return []
    if recipe.attention.backend is None:
        return [recipe.problem(WHERE, "set without attention.backend: with no backend, "
                               "torchax's own lowering runs every attention call",
                               hint="set attention.backend too (e.g. auto)")]
    if family is not None and not family.windows:
        return [recipe.problem(WHERE, f"family {family.name!r} does not window its "
                               "attention (its text and video tokens attend together, or "
                               "its pipeline runs its own loop)",
                               hint="windows run on Wan models; leave it out here")]
    found = _setting_problems(recipe)
    grid = family.token_grid(recipe) if family is not None else None
    if grid is None or found:
        return found
    return _grid_problems(recipe, family, grid)


def _setting_problems(recipe: Recipe) -> list[Problem]:
    """The section against itself and the step count."""
    spec, found = recipe.attention.window, []
    if spec.global_frames % spec.tile[0]:
        found.append(recipe.problem(f"{WHERE}.global_frames", f"{spec.global_frames} is "
                                    f"not a multiple of the tile's {spec.tile[0]} frames",
                                    hint="global keys are whole tiles"))
    steps = recipe.generate.steps
    if steps is not None and spec.dense_steps >= steps:
        found.append(recipe.problem(f"{WHERE}.dense_steps", f"{spec.dense_steps} dense "
                                    f"steps of {steps}: no step is windowed",
                                    hint=f"fewer than {steps}, or leave attention.window "
                                    "out"))
    return found


def _grid_problems(recipe: Recipe, family: ModelFamily, grid: tuple) -> list[Problem]:
    """The window against the video's token grid: the first problem found."""
    spec = recipe.attention.window
    shown = "x".join(map(str, spec.tile))
    found = [recipe.problem(f"{WHERE}.tile", f"{tile} {axis} per tile, but the video has "
                            f"{size} token {axis} ({'x'.join(map(str, grid))} tokens)",
                            hint=f"at most {size}")
             for axis, size, tile in zip(("frames", "height", "width"), grid, spec.tile)
             if tile > size]
    if found:
        return found
    tiling = Tiling(grid, tuple(spec.tile), tuple(spec.reach), spec.global_frames)
    count = math.prod(tiling.tiles)
    if count > MAX_TILES:
        return [recipe.problem(f"{WHERE}.tile", f"{count} tiles of {shown} tokens: at most "
                               f"{MAX_TILES}", hint="larger tiles (a tile is a kernel "
                               "block: 128 tokens or more suit every chip)")]
    text = family.text_length(recipe) if hasattr(family, "text_length") else None
    if math.prod(grid) == text:
        return [recipe.problem(
            WHERE, f"the video's {math.prod(grid)} tokens are as many as the text's: "
            "cross-attention to the text would be windowed as if it were the video's",
            hint="another size or generate.max_sequence_length")]
    if tiling.seen.all():
        return [recipe.problem(
            WHERE, f"every tile sees every other ({'x'.join(map(str, tiling.tiles))} "
            f"tiles of {shown} tokens, reach {'x'.join(map(str, spec.reach))}): attention "
            "stays dense, with padding",
            hint="smaller tiles or reach, or leave attention.window out")]
    return []
