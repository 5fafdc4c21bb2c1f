"""A recipe's transformer ported beside its PyTorch original: the mesh passes on a
pipeline the caller loaded (its PyTorch copy kept first), what the passes' call-time
parts work with around the ported transformer's calls (``porter.port.active.
transformer_calls``), and random inputs of the recipe's shapes. What ``porter verify``
compares and ``porter bench`` times."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from porter.errors import UsageError
from porter.families.base import ModelFamily
from porter.port import passes
from porter.transforms import Calling

if TYPE_CHECKING:
    from porter.recipe import Recipe
    from porter.registry import Registry
    from porter.runtime import Runtime


def refuse_undescribed(family: ModelFamily, command: str) -> None:
    """UsageError, before anything loads, for a family that does not describe its
    transformer's inputs (``ModelFamily.transformer_inputs``): the generic family, whose
    pipeline's own call makes them."""
    if type(family).transformer_inputs is ModelFamily.transformer_inputs:
        raise UsageError(f"porter {command} calls the transformer by itself, on inputs its "
                         f"family describes; family {family.name!r} describes none (the "
                         "pipeline's own call makes them)",
                         hint="compare whole runs with plain diffusers from the same seed "
                         "(as tests/matrix does), or `porter compile` for the programs")


def random_inputs(family: ModelFamily, recipe: Recipe, config) -> dict:
    """Seeded random float32 inputs of the recipe's shapes (host tensors); ``config``:
    the transformer's configuration."""
    generator = torch.Generator().manual_seed(recipe.verify.seed)
    inputs = {}
    for name, shape in family.transformer_inputs(recipe, config).items():
        if name == "timestep":
            inputs[name] = torch.full(shape, 500.0)
        else:
            inputs[name] = torch.randn(shape, generator=generator)
    return inputs


def cast(inputs: dict, dtype: torch.dtype) -> dict:
    """Inputs in the model's compute dtype; the timestep stays float32, as pipelines pass it."""
    return {k: v if k == "timestep" else v.to(dtype) for k, v in inputs.items()}


def ported(pipe, recipe: Recipe, registry: Registry, runtime: Runtime) -> Calling:
    """The mesh passes on ``pipe`` (the caller holds the patches), and what the passes'
    call-time parts work with around its calls."""
    record = passes.ported(pipe, recipe, registry, runtime)
    return Calling(recipe, registry, registry.family(recipe.model.family), runtime, record,
                   pipe)

