"""The patches pass: the recipe's, the core's and the family's patches
(``porter.shims.patch.Patch``), held while the model loads and around every call.

Plugins import ``Patch`` from here or from ``porter.shims.patch``: it is one class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from porter.shims.patch import Patch, PatchError, applied
from porter.transforms import CALL, Calling, Checking, Pass

if TYPE_CHECKING:
    from porter.errors import Problem
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe
    from porter.registry import Registry
    from porter.transforms.building import Building

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
            patch.check_target()
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
