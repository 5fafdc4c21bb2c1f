"""`porter inspect`: what a recipe author needs to write rules.

Each component's tensor names grouped into patterns (block numbers become
``*``), with shapes, dtypes and counts, and which sharding and dtype rules of
the recipe match them now, and which of its LoRA adapters change them. Built on
meta-device models: no model weights (LoRA files are read).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from porter.errors import RecipeError, UsageError
from porter.loading import abstract
from porter.port import checks
from porter.shims.walk import named_tensors
from porter.transforms import lora
from porter.transforms.sharding import normalize

if TYPE_CHECKING:
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe
    from porter.registry import Registry

DTYPE_NAMES = {"torch.float32": "f32", "torch.bfloat16": "bf16", "torch.float16": "f16",
               "torch.float64": "f64"}
NUMBER = re.compile(r"(?<=\.)\d+(?=\.)|^\d+(?=\.)")


def _first_match(rules, name: str):
    for index, rule in enumerate(rules):
        if re.fullmatch(rule.match, name):
            return index, rule
    return None, None


def component_rows(module, shard_rules, dtype_rules, adapted=None) -> list[dict]:
    """``adapted``: tensor name -> indices of the LoRA adapters that change it."""
    adapted = adapted or {}
    groups: dict[str, dict] = {}
    for name, tensor in named_tensors(module):
        pattern = NUMBER.sub("*", name)
        group = groups.setdefault(pattern, {"pattern": pattern, "count": 0, "shapes": set(),
                                            "dtypes": set(), "example": name, "lora": set()})
        group["count"] += 1
        group["lora"].update(adapted.get(name, ()))
        group["shapes"].add(tuple(tensor.shape))
        group["dtypes"].add(DTYPE_NAMES.get(str(tensor.dtype), str(tensor.dtype)))
    rows = []
    for group in groups.values():
        shard_index, shard = _first_match(shard_rules, group["example"])
        dtype_index, dtype_rule = _first_match(dtype_rules, group["example"])
        shapes = sorted(group["shapes"])
        rows.append({
            "pattern": group["pattern"], "count": group["count"],
            "shape": list(shapes[0]) if len(shapes) == 1 else [list(s) for s in shapes],
            "dtype": "/".join(sorted(group["dtypes"])),
            "sharding": None if shard is None else {"rule": shard_index,
                                                    "spec": list(normalize(shard.spec))},
            "dtype_rule": None if dtype_rule is None else dtype_index,
            "lora": sorted(group["lora"])})
    return rows


def inspect(recipe: Recipe, registry: Registry) -> dict:
    """Each component's rows (``component_rows``), after the checks of the recipe and
    its model's configuration that ``validate`` runs first."""
    problems = checks.input_problems(recipe, registry)
    if problems:
        raise RecipeError(problems)
    return build(recipe, registry)


def build(recipe: Recipe, registry: Registry) -> dict:
    family = registry.family(recipe.model.family)
    modules = abstract.components(family, recipe)
    if modules is None:
        raise UsageError(f"cannot inspect {recipe.model.source!r} without its configuration",
                         hint="point model.source at a local diffusers directory")
    adapted = _adapted(recipe, family, modules)
    return {name: component_rows(module, recipe.sharding.weights.get(name, []),
                                 recipe.dtypes.overrides.get(name, []), adapted.get(name))
            for name, module in modules.items()}


def _adapted(recipe: Recipe, family: ModelFamily, modules) -> dict[str, dict[str,
             list[int]]]:
    """component -> tensor name -> the LoRA adapters (recipe indices) that change it."""
    found: dict[str, dict[str, list[int]]] = {}
    for adapter in lora.read_all(recipe, family.pipeline_class(recipe), modules):
        for component, deltas in adapter.deltas.items():
            for name in lora.tensor_updates(deltas):
                found.setdefault(component, {}).setdefault(name, []).append(adapter.index)
    return found


def render(result: dict) -> str:
    lines = []
    for component, rows in result.items():
        lines.append(f"{component}: {sum(r['count'] for r in rows)} tensors")
        width = max(len(r["pattern"]) for r in rows)
        for row in rows:
            where = ("replicated" if row["sharding"] is None else
                     f"rule {row['sharding']['rule']} {row['sharding']['spec']}")
            kept = "" if row["dtype_rule"] is None else f", dtype rule {row['dtype_rule']}"
            if row["lora"]:
                kept += ", lora " + ",".join(str(i) for i in row["lora"])
            count = f" x{row['count']}" if row["count"] > 1 else ""
            lines.append(f"  {row['pattern']:<{width}} : {row['shape']} {row['dtype']}{count}"
                         f"  -> {where}{kept}")
    return "\n".join(lines)
