"""The port's passes, one room each: a module (or package) here does one pass's work
and declares its row, ``PASS``, beside it. ``porter.port.passes`` puts the rows in the
order a run applies them; the load pass's room is ``porter.loading`` and the step
cache's ``porter.stepcache``.

A row names the recipe sections its pass reads and says what it does in a line, and
has up to five parts, each optional:

- ``check(recipe, registry, family)``: problems the recipe alone shows (no model, no
  JAX). ``porter validate`` and every command that loads a model run these first;
  ``family`` is None when the recipe names an unknown family.
- ``fit(recipe, family, modules, axes)``: problems against the model's shapes
  (``modules``: the components built on the meta device; ``axes``: the mesh).
  ``validate`` and ``plan`` run these before any weight is read, and a run does again
  on the model as loaded, before any weight moves (a hub id with no configuration is
  known only then).
- ``apply(building)``: what ``porter run`` does, on the loaded pipeline. ``building``
  (``porter.port.building.Building``) holds what the passes before it recorded; a pass
  that records something writes the field named after it, and nothing else.
- ``abstract(building)``: what ``porter compile`` does, on meta models whose every
  tensor becomes a ``jax.ShapeDtypeStruct`` (None: the pass changes nothing a compiled
  program takes, as LoRA fused into the weights).
- ``detail(recipe, registry, family, modules)``: what this recipe asks of the pass, in
  a few words, for ``porter plan``; None when it asks nothing (the pass is skipped).

A new pass is a room here with its ``PASS``, and its place in ``porter.port.passes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Pass:
    name: str
    reads: tuple[str, ...]  # the recipe's sections
    does: str  # one line, for `porter plan` and the docs
    check: Callable | None = None
    fit: Callable | None = None
    apply: Callable | None = None
    abstract: Callable | None = None
    detail: Callable | None = None


def unknown_components(recipe, modules: dict, sections: dict) -> list:
    """Rules for a component the model does not have (``sections``: the recipe's key ->
    its rules per component): a typo, or the wrong model."""
    return [recipe.problem(f"{path}.{name}", f"the model has no component {name!r}",
                           hint=f"components: {', '.join(sorted(modules))}")
            for path, per_component in sections.items() for name in per_component
            if name not in modules]
