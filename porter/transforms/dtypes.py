"""Component dtypes and per-tensor overrides from the recipe's ``dtypes`` section.

Applied in torch, on the host, before weights move to JAX. float64 tensors
(e.g. rotary tables some models build in float64) become float32 here, on the
host, because JAX runs with x64 disabled and would otherwise truncate them
with a warning at transfer time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from porter.errors import Problem
from porter.shims import lazy
from porter.shims.walk import named_tensors
from porter.transforms import Checking, Pass, unknown_components
from porter.transforms.sketch import Tensor, dtype_name

torch = lazy.module("torch", __name__)

if TYPE_CHECKING:
    from porter.recipe import Recipe
    from porter.transforms.building import Building


class _ByName(Mapping):
    """A recipe's dtype names -> torch's dtypes, looked up when asked (torch imported
    at the first lookup, not with this module)."""

    def __init__(self, names: tuple[str, ...]):
        self._names = names

    def __getitem__(self, name: str) -> torch.dtype:
        if name not in self._names:
            raise KeyError(name)
        return getattr(torch, name)

    def __contains__(self, name) -> bool:  # Mapping's would look the dtype up
        return name in self._names

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


DTYPES = _ByName(("float32", "bfloat16", "float16"))


def component_dtype(recipe: Recipe, component: str) -> torch.dtype:
    return DTYPES[recipe.dtypes.components.get(component, recipe.model.dtype)]


def apply_all(components: dict, recipe: Recipe) -> None:
    """Apply the recipe's dtypes to every torch module in ``components``."""
    for name, module in components.items():
        if isinstance(module, torch.nn.Module):
            apply(module, component_dtype(recipe, name), recipe.dtypes.overrides.get(name, []))


def apply(module: torch.nn.Module, dtype: torch.dtype, rules) -> dict[str, torch.dtype]:
    """Cast floating tensors to ``dtype``, then matching ones to their rule's dtype.

    Returns the name -> dtype of every tensor a rule matched.
    """
    tensors = dict(named_tensors(module))
    casts, kept = targets(tensors, dtype_name(dtype), rules)
    for name, target in casts.items():
        tensors[name].data = tensors[name].data.to(getattr(torch, target))
    return {name: DTYPES[target] for name, target in kept.items()}


def sketched(sketches: dict, recipe: Recipe) -> dict:
    """The recipe's dtypes applied to component sketches (``porter.transforms.sketch``),
    as ``apply_all`` casts the modules: new sketches."""
    out = {}
    for name, sketch in sketches.items():
        casts, _ = targets(sketch.tensors, recipe.dtypes.components.get(
            name, recipe.model.dtype), recipe.dtypes.overrides.get(name, []))
        out[name] = sketch.with_tensors({
            n: Tensor(t.shape, casts[n]) if n in casts else t
            for n, t in sketch.tensors.items()})
    return out


def targets(tensors: dict, dtype: str, rules) -> tuple[dict[str, str], dict[str, str]]:
    """What ``apply`` does to ``tensors`` (name -> tensor or sketched tensor): the
    name -> dtype name of each one to cast, and of each one a rule matched."""
    compiled = [(re.compile(rule.match), rule.dtype) for rule in rules]
    casts, kept = {}, {}
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            continue
        target = next((d for rx, d in compiled if rx.fullmatch(name)), None)
        if target is not None:
            kept[name] = target
        target = target or dtype
        if dtype_name(tensor.dtype) != target:
            casts[name] = target
    return casts, kept


def rule_problems(recipe: Recipe) -> list[Problem]:
    problems = []
    for component, rules in recipe.dtypes.overrides.items():
        for i, rule in enumerate(rules):
            try:
                re.compile(rule.match)
            except re.error as exc:
                problems.append(recipe.problem(f"dtypes.overrides.{component}.{i}.match",
                                               f"invalid regex: {exc}"))
    return problems


def unmatched_problems(recipe: Recipe, component: str, sketch) -> list[Problem]:
    """Rules that matched no tensor of the component (its sketch; typos)."""
    names = list(sketch.tensors)
    problems = []
    for i, rule in enumerate(recipe.dtypes.overrides.get(component, [])):
        if not any(re.fullmatch(rule.match, n) for n in names):
            problems.append(recipe.problem(
                f"dtypes.overrides.{component}.{i}.match",
                f"{component}: rule {rule.match!r} matches no tensor (a typo?)"))
    return problems


def _check(c: Checking) -> list[Problem]:
    return rule_problems(c.recipe)


def _fit(c: Checking) -> list[Problem]:
    recipe, modules = c.recipe, c.modules
    found = unknown_components(recipe, modules, {
        "dtypes.overrides": recipe.dtypes.overrides,
        "dtypes.components": recipe.dtypes.components})
    for name, module in modules.items():
        found += unmatched_problems(recipe, name, module)
    return found


def _detail(c: Checking) -> str:
    recipe = c.recipe
    parts = [recipe.model.dtype]
    parts += [f"{name} {dtype}" for name, dtype in recipe.dtypes.components.items()]
    kept = sum(len(rules) for rules in recipe.dtypes.overrides.values())
    if kept:
        parts.append(f"{kept} override rule(s)")
    return ", ".join(parts)


def _apply(b: Building) -> None:
    apply_all(b.modules, b.recipe)


PASS = Pass(
    "dtypes", ("model.dtype", "dtypes"), "cast each component, keeping the tensors the "
    "overrides name in their own dtype",
    check=_check, fit=_fit, apply=_apply, abstract=_apply, detail=_detail)
