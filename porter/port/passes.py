"""The port's passes, in the order a run applies them: the one table that `validate`,
`plan`, `run`, the port's calls and `compile` read, and the driver that runs it.

Each row (``porter.transforms.Pass``) lives in its pass's room, beside the work it
does. The first passes work on the host (``HOST``); the rest (``MESH``, from quantize
on) need the mesh: ``ported`` applies those to a pipeline loaded some other way
(``porter verify`` and ``porter bench`` keep a PyTorch copy of it first). What a port
does around its calls is the rows' ``around`` parts, entered by ``porter.port.active``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from porter import loading
from porter.errors import RecipeError
from porter.stepcache import session as stepcache
from porter.transforms import (
    Checking,
    attention,
    dtypes,
    encodings,
    jit,
    lora,
    patches,
    placement,
    quantize,
    rotary,
    scheduler,
    setup,
    sketch,
)
from porter.transforms.building import Building, Loaded, Ported

if TYPE_CHECKING:
    from porter.errors import Problem
    from porter.recipe import Recipe
    from porter.registry import Registry
    from porter.runtime import Runtime

HOST = (patches.PASS, loading.PASS, setup.PASS, scheduler.PASS, lora.PASS, dtypes.PASS)
MESH = (quantize.PASS, placement.PASS, rotary.PASS, jit.PASS, attention.PASS, stepcache.PASS,
        encodings.PASS)
PASSES = HOST + MESH


def check_problems(c: Checking) -> list[Problem]:
    """Every pass's ``check``: what the recipe alone shows."""
    return [problem for step in PASSES if step.check for problem in step.check(c)]


def fit_problems(c: Checking) -> list[Problem]:
    """Every pass's ``fit``: the recipe against the model's shapes (``c.modules``) on
    ``c.axes``."""
    return [problem for step in PASSES if step.fit for problem in step.fit(c)]


def details(c: Checking) -> list[dict]:
    """What each pass does for this recipe and model, in order, once and around each
    call (``porter plan``)."""
    rows = []
    for step in PASSES:
        detail = step.detail(c) if step.detail else None
        rows.append({"pass": step.name, "reads": list(step.reads), "does": step.does,
                     "applies": bool(detail), "detail": detail or "",
                     "each_call": step.each_call})
    return rows


def build(b: Building, abstract: bool = False) -> Building:
    """Every pass, in order (``abstract``: as ``porter compile`` does); the patches stay
    applied until ``b.stack`` is closed. The fits run again on the model as loaded,
    before any weight moves: where no configuration was at hand before loading (a hub
    id), this is where they are first checked."""
    start = time.perf_counter()
    loading.abstract.import_classes(b.family, b.recipe)  # before the patches apply
    _run(HOST, b, abstract)
    b.timings["load_s"] = round(time.perf_counter() - start, 4)  # LoRA, dtypes too
    sketches = {name: sketch.of(module) for name, module in b.modules.items()}
    problems = fit_problems(Checking(b.recipe, b.registry, b.family, sketches,
                                     b.runtime.axes))
    if problems:
        raise RecipeError(problems)
    return port(b, abstract)


def port(b: Building, abstract: bool = False) -> Building:
    """The mesh passes on ``b.pipe`` (loaded, its LoRA fused and dtypes cast)."""
    start = time.perf_counter()
    _run(MESH, b, abstract)
    b.timings["to_jax_s"] = round(time.perf_counter() - start, 4)
    return b


def ported(pipe, recipe: Recipe, registry: Registry, runtime: Runtime) -> Ported:
    """The mesh passes on a pipeline loaded otherwise (its LoRA fused, dtypes cast; the
    caller holds the patches, so the record applies none around calls)."""
    b = Building(recipe, registry, registry.family(recipe.model.family), runtime)
    b.load = Loaded(pipe, loading.torch_components(pipe), {}, {})
    return port(b).ported()


def _run(steps: tuple, b: Building, abstract: bool) -> None:
    for step in steps:
        work = step.abstract if abstract else step.apply
        if work is not None:
            work(b)
