"""Rotary tables computed once on the host, handed to the compiled transformer.

A family builds the tables for the recipe's fixed shapes (in float64 where
the model does); they are cast, placed on the mesh and registered as buffers
of the rotary module, so the compiled transformer receives them as inputs
instead of rebuilding them inside the graph. The family's rotary patch
replaces the module's forward with ``lookup`` keyed by shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from porter.shims import lazy
from porter.shims.interop import to_device
from porter.transforms import Checking, Pass

torch = lazy.module("torch", __name__)

if TYPE_CHECKING:
    from porter.errors import Problem
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe
    from porter.transforms.building import Building

CACHE_ATTR = "_porter_rotary_cache"


def install(module: torch.nn.Module, key: tuple, tables, place, dtype: torch.dtype) -> None:
    """Register ``tables`` (cast to ``dtype``, then ``place``d: onto the mesh, or as a
    meta tensor for an abstract port) as buffers of ``module``, looked up by ``key``."""
    cache = module.__dict__.setdefault(CACHE_ATTR, {})
    names = []
    for index, table in enumerate(tables):
        name = f"porter_rotary_{'x'.join(map(str, key))}_{index}"
        module.register_buffer(name, place(table.to(dtype)), persistent=False)
        names.append(name)
    cache[key] = tuple(names)


def lookup(module: torch.nn.Module, key: tuple):
    """The cached tables for ``key``, or None (the caller computes them itself)."""
    names = module.__dict__.get(CACHE_ATTR, {}).get(key)
    return None if names is None else tuple(getattr(module, n) for n in names)


def cached_forward(original):
    """Patch factory for a rotary module whose ``forward(hidden_states)`` depends only
    on the latent grid (the dims after batch and channels): serve cached tables for
    known grids, compute the rest as before."""
    def forward(self, hidden_states):
        tables = lookup(self, tuple(hidden_states.shape[2:]))
        return tables if tables is not None else original(self, hidden_states)
    forward.__doc__ = original.__doc__
    return forward


def host_tables(module: torch.nn.Module, shape: tuple) -> tuple:
    """Run a rotary module's own forward on the host for a latent ``shape``.

    Only the shape and device of the input are read, so a stand-in is passed.
    """
    from types import SimpleNamespace

    with torch.no_grad():
        return module(SimpleNamespace(shape=torch.Size(shape), device=torch.device("cpu")))


def apply(pipe, family: ModelFamily, recipe: Recipe, place) -> int:
    """Install every table the family offers, each ``place``d (a host tensor in, what the
    module holds out); returns how many sets were cached."""
    entries = family.rotary_tables(pipe, recipe)
    for module, key, tables, dtype in entries:
        install(module, key, tables, place, dtype)
    return len(entries)


def _apply(b: Building) -> None:
    if b.recipe.rotary.precompute:
        apply(b.pipe, b.family, b.recipe, lambda table: to_device(table, b.runtime))


def _abstract(b: Building) -> None:
    if b.recipe.rotary.precompute:  # the tables' buffers: shapes only here
        apply(b.pipe, b.family, b.recipe, lambda table: table.to("meta"))


def _check(c: Checking) -> list[Problem]:
    recipe, family = c.recipe, c.family
    if family is None or not recipe.rotary.precompute \
            or family.rotary_patch_for(recipe) is not None:
        return []
    return [recipe.problem("rotary.precompute", f"family {family.name!r} has no rotary "
                           "cache", hint="set it to false")]


def _detail(c: Checking) -> str | None:
    return "tables computed once, on the host, outside the compiled programs" \
        if c.recipe.rotary.precompute else None


PASS = Pass(
    "rotary", ("rotary",), "compute the rotary tables once and hand them to the model, "
    "instead of computing them inside every program",
    check=_check, apply=_apply, abstract=_abstract, detail=_detail)
