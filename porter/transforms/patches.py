"""Named, documented, reversible replacements of functions, methods or attributes.

A ``Patch`` names its target by import path (``module:Attr.attr``), says which
library versions it is known to fit, and builds its replacement from the
original plus parameters. Plugins (and the core) register patches through the
``porter_register_patches`` hook; recipes list them by name. Patches work
outside Porter too::

    from porter_wan.patches import ROPE_CACHE
    with ROPE_CACHE.applied():
        ...  # your own pipeline, patched; originals restored on exit
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from porter.errors import UsageError
from porter.shims.attributes import replaced
from porter.shims.compat import import_module
from porter.transforms import CALL, Calling, Checking, Pass

if TYPE_CHECKING:
    from porter.errors import Problem
    from porter.families.base import ModelFamily
    from porter.port.building import Building
    from porter.recipe import Recipe
    from porter.registry import Registry


class PatchError(UsageError):
    """A patch cannot be applied: missing target, unknown parameter."""


@dataclass(frozen=True)
class Patch:
    name: str
    target: str  # "package.module:Class.method" or "package.module:function"
    doc: str
    replacement: Callable[..., Any]  # replacement(original, **params) -> new value
    fits: str = ""  # versions known to fit, e.g. "diffusers>=0.35,<0.43"
    params: dict[str, Any] = field(default_factory=dict)  # accepted params and defaults
    #: a function other modules import by name (``from m import f``): replaced in every
    #: loaded module that holds it too, not only where it is defined
    imported_by_name: bool = False

    def installed_fits(self) -> tuple[str, str | None, bool | None]:
        """(library, installed version, whether ``fits`` admits it); None where the
        patch names no versions or the library is not installed."""
        from importlib.metadata import PackageNotFoundError, version

        from packaging.requirements import InvalidRequirement, Requirement

        try:
            wanted = Requirement(self.fits)
        except InvalidRequirement:
            return "", None, None
        try:
            found = version(wanted.name)
        except PackageNotFoundError:
            return wanted.name, None, None
        return wanted.name, found, wanted.specifier.contains(found, prereleases=True)

    def locate(self) -> tuple[Any, str, Any]:
        """(owner, attribute name, current value); PatchError if it does not exist."""
        module_name, _, path = self.target.partition(":")
        try:
            owner = import_module(module_name)
        except ImportError as exc:
            raise PatchError(f"patch {self.name}: cannot import {module_name} ({exc})",
                             hint=f"known to fit {self.fits or 'unspecified versions'}") from None
        parts = path.split(".")
        for part in parts[:-1]:
            owner = getattr(owner, part, None)
            if owner is None:
                break
        if owner is None or not hasattr(owner, parts[-1]):
            raise PatchError(f"patch {self.name}: target {self.target} does not exist in the "
                             "installed library", hint=f"known to fit "
                             f"{self.fits or 'unspecified versions'}; check your versions")
        return owner, parts[-1], getattr(owner, parts[-1])

    def check_params(self, params: dict) -> None:
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            accepted = ", ".join(sorted(self.params)) or "none"
            raise PatchError(f"patch {self.name}: unknown parameter(s) {', '.join(unknown)}",
                             hint=f"accepted: {accepted}")

    @contextlib.contextmanager
    def applied(self, **params):
        """Apply for the duration of a ``with`` block; restored even on error."""
        self.check_params(params)
        owner, attr, original = self.locate()
        value = self.replacement(original, **{**self.params, **params})
        with contextlib.ExitStack() as stack:
            for holder, name in [(owner, attr)] + (
                    _holders(original, owner, attr) if self.imported_by_name else []):
                stack.enter_context(replaced(holder, name, value))
            yield


def _holders(original, owner, attr: str) -> list[tuple[Any, str]]:
    """Every other module's name for ``original`` (imported by name), among the modules
    loaded when the patch is applied (a model module imported later keeps its own)."""
    import sys

    found = []
    for module in list(sys.modules.values()):
        names = getattr(module, "__dict__", None)
        if not isinstance(names, dict) or module is owner:
            continue
        found += [(module, name) for name, value in list(names.items())
                  if value is original]
    return found


@contextlib.contextmanager
def applied(selected: list[tuple[Patch, dict]]):
    """Apply several patches in order; undone in reverse order."""
    with contextlib.ExitStack() as stack:
        for patch, params in selected:
            stack.enter_context(patch.applied(**params))
        yield


def references(recipe: Recipe) -> list[tuple[str, dict, int]]:
    """(name, params, index in the recipe's list) for each patch the recipe names."""
    out = []
    for index, entry in enumerate(recipe.patches):
        if isinstance(entry, str):
            out.append((entry, {}, index))
        else:
            out.append((entry.name, dict(entry.params), index))
    return out


#: patches every run applies: they make torchax behave as PyTorch does
CORE_PATCHES = ("core.setitem", "core.deepcopy", "core.view_index", "core.type_as",
                "core.view_tolist", "core.view_of_view", "core.host_inplace",
                "core.block_mask", "core.flex_attention")


def selected(recipe: Recipe, registry: Registry, family: ModelFamily) -> list[tuple[Patch,
             dict]]:
    """The recipe's patches, then the core's (``CORE_PATCHES``), the family's required
    ones and its rotary patch when tables are precomputed (each once)."""
    extra = CORE_PATCHES + family.required_patches
    if recipe.rotary.precompute:
        extra += (family.rotary_patch_for(recipe),)
    chosen = [(registry.patches[name], params) for name, params, _ in references(recipe)]
    chosen += [(registry.patches[name], {}) for name in extra
               if name not in {p.name for p, _ in chosen}]
    return chosen


def problems(recipe: Recipe, registry: Registry) -> list:
    """Unknown names, unknown parameters, targets missing from installed libraries."""
    import difflib

    found = []
    for name, params, index in references(recipe):
        path = f"patches.{index}"
        patch = registry.patches.get(name)
        if patch is None:
            close = difflib.get_close_matches(name, list(registry.patches), n=1)
            found.append(recipe.problem(path, f"unknown patch {name!r}", hint=(
                f"did you mean {close[0]!r}?" if close else "`porter patches` lists them")))
            continue
        try:
            patch.check_params(params)
            patch.locate()
        except PatchError as exc:
            found.append(recipe.problem(path, exc.message, hint=exc.hint))
    return found


def _check(c: Checking) -> list[Problem]:
    return problems(c.recipe, c.registry)


def _apply(b: Building) -> None:
    """The patches, held while the model loads and the passes run (``b.stack``)."""
    b.patches = selected(b.recipe, b.registry, b.family)
    b.stack.enter_context(applied(b.patches))


def _detail(c: Checking) -> str:
    return ", ".join(patch.name for patch, _ in selected(c.recipe, c.registry, c.family))


def _around(c: Calling):
    return applied(c.ported.patches) if c.scope == CALL else None


PASS = Pass(
    "patches", ("patches", "rotary.precompute"), "replace code JAX cannot trace (the "
    "core's, the family's and the recipe's patches), held while the model loads",
    each_call="the same patches, applied again",
    check=_check, apply=_apply, abstract=_apply, detail=_detail, around=_around)
