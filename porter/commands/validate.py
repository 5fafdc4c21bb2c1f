"""`porter validate`: every check that needs no weights (``porter.port.checks``), for
the devices JAX sees or for a machine that need not be this one, and whether the run
could write where it will."""

from __future__ import annotations

from typing import TYPE_CHECKING

from porter.errors import Problem
from porter.port import checks
from porter.rundir.outputs import output_dir
from porter.runtime import atomic, compile_cache, notices
from porter.transforms import quantize

if TYPE_CHECKING:
    from porter.recipe import Recipe
    from porter.registry import Registry


def validate(recipe: Recipe, registry: Registry, devices: int | None = None,
             target=None, skipped: list | None = None) -> list[Problem]:
    """Every problem; mesh and sharding for ``devices`` devices when given (as if: none
    need exist; of a TPU slice ``target``, a ``porter.aot.targets.Target``, with its
    platform), else for the devices JAX sees. ``skipped`` is told which checks could
    not be made (a model with no configuration here)."""
    problems = checks.input_problems(recipe, registry)
    if problems:
        return problems  # shape checks need a sound recipe and build the same model
    problems = checks.checkpoint_problems(recipe) or checks.lora_problems(recipe, registry)
    if problems:
        return problems
    if target is not None:
        devices = target.chips
    problems = checks.mesh_problems(recipe, registry, devices, target and target.platform,
                                    target and target.name)
    if target is not None:  # a full 8-bit format the chip runs no faster
        problems += quantize.chip_problems(recipe, target.platform, target.facts.name)
    return problems or (checks.shape_problems(recipe, registry, devices, skipped)
                        + write_problems(recipe))


def write_problems(recipe: Recipe) -> list[Problem]:
    """Where the run will write, checked writable now (a run finds out before loading
    anything, `validate` before the run). The compile cache is optional, as in a run:
    an unwritable one is a warning."""
    problems = []
    why = atomic.writable_problem(output_dir(recipe))
    if why:
        problems.append(recipe.problem("output.dir", f"cannot write the output directory: "
                                       f"{why}", hint="choose a directory you can write "
                                       "(output.dir=...)"))
    cache = compile_cache.directory(recipe.runtime.compile_cache)
    why = atomic.writable_problem(cache) if cache is not None else None
    if why:
        notices.warn(f"the compile cache cannot be written: {why}; a run goes on without "
                     "it (every run compiles from scratch)", hint="set "
                     "runtime.compile_cache (or PORTER_CACHE_DIR) to a writable directory, "
                     "or false")
    return problems
