"""The port's passes, one room each: a module (or package) here does one pass's work
and declares its row, ``PASS``, beside it. ``porter.port.passes`` puts the rows in the
order a run applies them; the load pass's room is ``porter.loading`` and the step
cache's ``porter.stepcache.session``.

A row names the recipe sections its pass reads, says what it does once and what it
does around each call (a line each), and has up to six parts, each optional, each a
function of one input object and named the same in every pass module
(``tests/test_layout.py`` holds both):

- ``_check(c: Checking)``: problems the recipe alone shows (no model, no JAX).
  ``porter validate`` and every command that loads a model run these first;
  ``c.family`` is None when the recipe names an unknown family.
- ``_fit(c: Checking)``: problems against the model's shapes (``c.modules``: the
  components' sketches, ``porter.transforms.sketch``; ``c.axes``: the mesh).
  ``validate`` and ``plan`` run these before any weight is read, and a run does again
  on the model as loaded, before any weight moves (a hub id with no configuration is
  known only then).
- ``_apply(b: Building)``: what ``porter run`` does, once, on the loaded pipeline
  (``porter.transforms.building.Building``: what the passes before it recorded; a pass that
  records something writes the field named after it, and nothing else).
- ``_abstract(b: Building)``: what ``porter compile`` does, on meta models whose every
  tensor becomes a ``jax.ShapeDtypeStruct`` (None: the pass changes nothing a compiled
  program takes, as LoRA fused into the weights; a row may name ``_apply`` here when
  the work is the same).
- ``_detail(c: Checking)``: what this recipe asks of the pass, in a few words, for
  ``porter plan``; None when it asks nothing (the pass is skipped).
- ``_around(c: Calling)``: a context manager the port's calls run inside, or None when
  the pass has nothing to do around this call. Entered in the table's order
  (``porter.port.active``) at two scopes: around a whole call of the port's components
  (``CALL``: a generation, ``porter verify``'s and ``porter bench``'s calls, the programs
  ``porter compile`` traces), and, inside it, around a transformer's calls (``STEP``: a
  denoising step, or a transformer called by itself). Whatever a port does at call time
  is here, so ``validate``, ``plan``, ``run`` and ``compile`` read the same table.

A new pass is a room here with its ``PASS``, and its place in ``porter.port.passes``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Callable, ContextManager

if TYPE_CHECKING:
    from porter.errors import Problem
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe
    from porter.registry import Registry
    from porter.runtime import Runtime
    from porter.transforms.building import Building, Ported

#: the scopes a pass's ``around`` is entered at: a call of the port's components, and a
#: transformer's calls inside it
CALL, STEP = "call", "step"


@dataclass(frozen=True)
class Checking:
    """What a pass's ``check``, ``fit`` and ``detail`` look at."""

    recipe: Recipe
    registry: Registry
    family: ModelFamily | None  # None: the recipe names an unknown family (check only)
    modules: dict | None = None  # fit, detail: the components' sketches (``sketch``)
    axes: dict | None = None  # fit, detail: the mesh's axes and sizes


@dataclass(frozen=True)
class Calling:
    """What a pass's ``around`` works with: one call of a built port's components."""

    recipe: Recipe  # the call's: the port's, or a generation's with its own settings
    registry: Registry
    family: ModelFamily
    runtime: Runtime
    ported: Ported  # the built port's records (the patches applied, the step cache)
    pipe: object = None  # the pipeline (None: an abstract port, ``porter compile``'s)
    #: a generation (``porter.generate.call.Call``; None: components called directly)
    call: object = None
    scope: str = CALL
    #: at ``STEP``, the denoising step's index (None: a transformer called by itself)
    step: int | None = None

    def at_step(self, step: int | None = None) -> Calling:
        """The same call at ``STEP`` scope: a transformer's calls (of step ``step``)."""
        return dataclasses.replace(self, scope=STEP, step=step)


@dataclass(frozen=True)
class Pass:
    name: str
    reads: tuple[str, ...]  # the recipe's sections
    does: str  # once, in a line, for `porter plan` and the docs
    _: KW_ONLY  # the rest by name: a part is never mistaken for another
    each_call: str = ""  # what ``around`` does at call time, in a line ("": nothing)
    check: Callable[[Checking], list[Problem]] | None = None
    fit: Callable[[Checking], list[Problem]] | None = None
    apply: Callable[[Building], None] | None = None
    abstract: Callable[[Building], None] | None = None
    detail: Callable[[Checking], str | None] | None = None
    around: Callable[[Calling], ContextManager | None] | None = None


def unknown_components(recipe: Recipe, modules: dict, sections: dict) -> list[Problem]:
    """Rules for a component the model does not have (``sections``: the recipe's key ->
    its rules per component): a typo, or the wrong model."""
    return [recipe.problem(f"{path}.{name}", f"the model has no component {name!r}",
                           hint=f"components: {', '.join(sorted(modules))}")
            for path, per_component in sections.items() for name in per_component
            if name not in modules]
