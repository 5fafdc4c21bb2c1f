"""The cache pass, and a port's step cache across runs: set up at porting, reset and
aimed at each run, summarised in each run's record."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from porter.errors import RecipeError
from porter.runtime import notices
from porter.shims.walk import block_lists
from porter.stepcache import (
    calibration,
    hooks,
    problems,
    ratios_file,
    settings,
    unwrapped,
)
from porter.stepcache.guidance import GuidanceCache
from porter.transforms import CALL, Calling, Checking, Pass
from porter.transforms.jit import in_pieces

if TYPE_CHECKING:
    from porter.errors import Problem
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe
    from porter.transforms.building import Building


class Caching:
    """The cache of one port: hooks on each cached component (``modules``: name ->
    transformer compiled in pieces, ``hooks.check``ed), or a GuidanceCache per run
    for the guidance method."""

    def __init__(self, chosen, modules: dict, recipe: Recipe):
        self.chosen = chosen
        self.modules = modules
        self.calibrating = chosen.method == "magcache" and chosen.calibrate
        self.ratios: dict[str, list[float]] = {}  # MagCache's, read once (refused now)
        if chosen.method == "magcache" and not self.calibrating:
            self.ratios = {name: self._ratios(recipe, name) for name in modules}
            _foreign_ratios(recipe, modules)
        self.tallies = {name: hooks.install(module, chosen) for name, module in modules.items()}
        self.calibration: dict = {}
        self.steps: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self.guidance: GuidanceCache | None = None

    def begin(self, pipe, family: ModelFamily, recipe: Recipe, start_step: int = 0) -> None:
        """Before a run: every state cold; MagCache aimed at this run's steps (a
        resumed run's remaining ones from ``start_step``)."""
        self.steps = family.transformer_steps(pipe, recipe)
        self.done, before = {}, start_step
        for name, count in self.steps.items():  # what each transformer ran before
            self.done[name] = min(before, count)
            before -= self.done[name]
        for name, tally in self.tallies.items():
            hooks.reset(self.modules[name])
            if self.calibrating:
                tally.listeners.clear()
                self.calibration[name] = hooks.Calibration(tally)
            elif self.chosen.method == "magcache":
                hooks.retarget(tally, self.ratios[name], self.steps.get(name, 0),
                               self.done.get(name, 0))
        self.guidance = None
        if self.chosen.method == "guidance":
            self.guidance = GuidanceCache(settings(recipe), recipe.generate.steps, start_step)

    def _ratios(self, recipe: Recipe, name: str) -> list[float]:
        given = settings(recipe).mag_ratios
        if isinstance(given, list):
            if len(self.modules) > 1:
                raise RecipeError([recipe.problem(
                    "cache.mag_ratios", f"one list of ratios, {len(self.modules)} "
                    "transformers", hint="`porter calibrate` writes a file with each "
                    "transformer's ratios")])
            return given
        ratios = calibration.read(ratios_file(recipe))["ratios"]
        if name not in ratios:
            raise RecipeError([recipe.problem(
                "cache.mag_ratios", f"{given}: no ratios for {name}",
                hint=f"it has {', '.join(ratios)}; calibrate this recipe's model")])
        return calibration.curve(ratios[name])

    def summary(self) -> dict:
        """What the cache did in the last run, for the run record."""
        if self.chosen.method == "guidance":
            return self._guidance_summary()
        computed = total = calls = 0
        skipped: dict = {}
        offset = 0
        for name, tally in self.tallies.items():
            per_context: dict[str, int] = {}
            first = offset + self.done.get(name, 0)  # the step before this one's first call
            for context, ran in tally.calls:
                per_context[context] = per_context.get(context, 0) + 1
                calls += 1
                computed += ran
                total += tally.blocks_per_call
                if ran < tally.blocks_per_call:  # some block was skipped or predicted
                    skipped.setdefault(context, []).append(first + per_context[context])
            offset += self.steps.get(name, 0)
        found = {"method": self.chosen.method + (" (calibrating)" if self.calibrating else ""),
                 "calls": calls, "blocks_computed": computed, "blocks_total": total,
                 "skipped_calls": sum(len(steps) for steps in skipped.values()),
                 "skipped_steps": skipped}
        if self.calibrating:
            found["ratios"] = {name: dict(c.ratios) for name, c in self.calibration.items()}
        return found

    def _guidance_summary(self) -> dict:
        guidance = self.guidance
        total = computed = 0
        for expert, both in guidance.steps:  # each step run: its expert, both branches?
            blocks = sum(len(b) for _, b in block_lists(unwrapped(expert)))
            total += 2 * blocks
            computed += (2 if both else 1) * blocks
        return {"method": "guidance", "calls": sum(2 if both else 1 for _, both in
                                                    guidance.steps),
                "blocks_computed": computed, "blocks_total": total,
                "skipped_calls": len(guidance.reused), "skipped_steps": guidance.reused}


def _foreign_ratios(recipe: Recipe, modules: dict) -> None:
    """Warn when a ratio file was calibrated for another model, or names transformers
    this one lacks (ratios are the model's: another model's mislead MagCache)."""
    path = ratios_file(recipe)
    if path is None:
        return
    data = calibration.read(path)
    extra = sorted(set(data["ratios"]) - set(modules))
    if extra:
        notices.warn(f"{path.name}: ratios for {', '.join(extra)}, which this model "
                     "does not have: calibrated for another model?")
    made_for = data.get("model") or {}
    mine = {"family": recipe.model.family, "source": recipe.model.source,
            "variant": recipe.model.variant}
    if any(made_for.get(key) != value for key, value in mine.items()):
        notices.warn(f"{path.name} was calibrated for {made_for.get('family')} "
                     f"{made_for.get('source')} {made_for.get('variant') or ''}".rstrip()
                     + f", not {recipe.model.source}: its ratios may not fit this model")


# ------------------------------------------------------------------------- the pass

def fit_problems(recipe: Recipe, family: ModelFamily, modules: dict) -> list:
    """Can the ``cache:`` section's method work on these modules (``modules``: their
    sketches; their structure only, before any weight moves)?"""
    chosen = settings(recipe)
    if chosen is None or chosen.method == "guidance":
        return []
    names = in_pieces(recipe, modules, lambda sketch: sketch.blocks)
    if not names:
        return [recipe.problem("cache.method", f"{chosen.method} works on a transformer's "
                               "block list; this pipeline's transformer has none",
                               hint="leave the cache section out for this model")]
    unstepped = [name for name in names if name not in family.stepped_transformers]
    if unstepped:
        return [recipe.problem("cache.method", f"family {family.name!r} does not say which "
                               f"steps {', '.join(unstepped)} runs", hint="a plugin's "
                               "transformer_steps and stepped_transformers say it")]
    for name in names:
        try:
            hooks.check(modules[name].torch(), chosen)
        except hooks.Misfit as exc:
            return [recipe.problem(f"cache.{exc.key}", f"{name}: {exc}", hint=exc.hint)]
    return []


def _check(c: Checking) -> list[Problem]:
    return [] if c.family is None else problems(c.recipe, c.family)


def _fit(c: Checking) -> list[Problem]:
    return fit_problems(c.recipe, c.family, c.modules)


def _apply(b: Building) -> None:
    if b.recipe.cache:
        b.cache = Caching(settings(b.recipe), {name: b.modules[name] for name in
                                               in_pieces(b.recipe, b.modules)}, b.recipe)


def _detail(c: Checking) -> str | None:
    chosen = settings(c.recipe)
    return None if chosen is None else chosen.method


@contextlib.contextmanager
def _serving(c: Calling, caching: Caching):
    """Every cache state cold before the call (a run continued mid-denoise starts its
    cache there); what the cache did in the call's timings after it."""
    call = c.call
    start = call.first_step
    with c.runtime.env:
        caching.begin(c.pipe, c.family, c.recipe, start)
    call.guidance_cache = caching.guidance
    if start:
        notices.warn(f"continuing after step {start}: the step cache starts cold there "
                     "(and TaylorSeer counts its steps from there), so the result can "
                     "differ slightly from an uninterrupted run")
    yield
    call.timings["cache"] = caching.summary()


def _around(c: Calling):
    """Around a generation that denoises (a pipeline's own loop always does)."""
    caching = c.ported.caching
    if c.scope != CALL or caching is None or c.call is None \
            or ("denoise" not in c.call.wanted and c.family.staged):
        return None
    return _serving(c, caching)


PASS = Pass(
    "cache", ("cache",), "a step cache's hooks on the transformers compiled in pieces",
    each_call="every cache state cold before a generation that denoises (from its first "
    "step); what the cache did in its record after it",
    check=_check, fit=_fit, apply=_apply, detail=_detail, around=_around)
