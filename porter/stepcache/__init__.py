"""Step caching: skip, or predict, work a denoising step would repeat.

A recipe's ``cache:`` section names one method (``porter.stepcache.methods``).
Under compilation the data-dependent decisions of these methods cannot live
inside one compiled transformer, so a cached transformer is compiled in pieces
(each child that holds weights, each block of its block lists: one program per
piece, the same for every step) and the decisions are taken on the host between
them, by diffusers' own hooks (``porter.stepcache.hooks``): MagCache's from a
schedule known before the loop, the first-block cache's from one scalar per
call. The guidance cache (``porter.stepcache.guidance``) works one level up, in the
family's guided prediction. A recipe without ``cache:`` is ported exactly as
before. The port's cache pass sets it up (``porter.stepcache.session``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from porter import recipe as recipe_mod
from porter.shims.interop import unwrapped
from porter.stepcache import calibration
from porter.stepcache.methods import METHODS, parse

if TYPE_CHECKING:
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe


def settings(recipe: Recipe):
    """The recipe's cache method (a ``porter.stepcache.methods`` model), or None."""
    return parse(dict(recipe.cache)) if recipe.cache else None


def problems(recipe: Recipe, family: ModelFamily) -> list:
    """What is wrong with the ``cache:`` section, found without weights."""
    if not recipe.cache:
        return []
    try:
        chosen = settings(recipe)
    except ValueError as exc:
        return [recipe.problem(f"cache.{key}", message, hint)
                for key, message, hint in exc.problems]
    found = []
    if recipe.generate.steps is None:  # the cache's windows are fractions of the steps
        found.append(recipe.problem("generate.steps", f"a {chosen.method} cache needs the "
                                    "run's step count", hint="set generate.steps"))
    if chosen.method == "guidance":
        if chosen.start >= chosen.end:
            found.append(recipe.problem("cache.start", f"the window starts ({chosen.start}) "
                                        f"at or after its end ({chosen.end})",
                                        hint="start < end, as fractions of the steps"))
        if not family.staged:
            found.append(recipe.problem(
                "cache.method", f"family {family.name!r} runs the pipeline's own loop: "
                "Porter cannot leave out one branch of its guidance",
                hint="methods for it: magcache, first_block, taylorseer"))
        elif family.cfg_scale(recipe) <= 1.0:
            found.append(recipe.problem(
                "cache.method", "the guidance cache needs classifier-free guidance: a "
                f"scale of {family.cfg_scale(recipe)} runs one branch",
                hint="set generate.guidance_scale above 1, or another method"))
        if recipe.generate.cfg_parallel:
            found.append(recipe.problem(
                "cache.method", "the guidance cache runs the branches apart: with "
                "cfg_parallel they are one batched call", hint="generate.cfg_parallel: false"))
    else:
        for name, rule in recipe.compile.items():
            if name.startswith("transformer") and rule.modules is not None:
                found.append(recipe.problem(
                    f"compile.{name}.modules", f"a {chosen.method} cache compiles {name} in "
                    "pieces of its own (each child and each block)",
                    hint="leave compile.<component>.modules out with a cache"))
    if chosen.method == "magcache" and not chosen.calibrate:
        found += _ratio_problems(recipe, chosen)
    return found


def _ratio_problems(recipe: Recipe, chosen) -> list:
    ratios = chosen.mag_ratios
    if ratios is None:
        return [recipe.problem("cache.mag_ratios", "MagCache needs the model's magnitude "
                               "ratios", hint=f"`porter calibrate {recipe.path or 'R'}` "
                               "writes them; then cache.mag_ratios: <that file>")]
    if isinstance(ratios, list):
        return [] if ratios else [recipe.problem("cache.mag_ratios", "no ratios given")]
    path = recipe.file_path("cache.mag_ratios", ratios)
    if not path.is_file():
        return [recipe.problem("cache.mag_ratios", f"{ratios!r} is not a file",
                               hint="`porter calibrate` writes one; "
                                    + recipe.relative_paths("cache.mag_ratios"))]
    try:
        calibration.read(path)
    except ValueError as exc:
        return [recipe.problem("cache.mag_ratios", f"{ratios}: {exc}",
                               hint="write it again with `porter calibrate`")]
    return []


def without_cache(recipe: Recipe):
    """The recipe with its ``cache:`` section removed: what `porter verify` checks and
    `porter bench` times a step of (the port's numbers, not what a cache skips)."""
    if not recipe.cache:
        return recipe

    data = recipe.resolved()
    data.pop("cache", None)
    return recipe_mod.validate_data(data, dict(recipe._locations), recipe.path)


def ratios_file(recipe: Recipe) -> Path | None:
    chosen = settings(recipe)
    if chosen is None or not isinstance(getattr(chosen, "mag_ratios", None), str):
        return None
    return recipe.file_path("cache.mag_ratios", chosen.mag_ratios)


def context(model, name: str):
    """``model``'s calls inside the block belong to the denoising call ``name``
    (cond, uncond): each keeps its own cache state, as diffusers' pipelines do.
    A model without a cache: nothing happens."""
    module = unwrapped(model)
    if getattr(module, "_porter_cache", None) is None:
        return contextlib.nullcontext()
    from diffusers.hooks.hooks import CacheContext, _set_cache_context

    @contextlib.contextmanager
    def entered():
        _set_cache_context(module, CacheContext(name))
        try:
            yield
        finally:
            _set_cache_context(module, None)
    return entered()


__all__ = ["METHODS", "context", "parse", "problems",
           "ratios_file", "settings", "unwrapped", "without_cache"]
