"""``quantize``: linear layers' weights in an 8-bit format and, for ``fp8`` and ``int8``,
their matmuls on 8-bit operands (``linear``), per output channel and per token
(``formats``).

The pass runs after LoRA is fused and dtypes are cast, before placement: each chosen
``torch.nn.Linear`` becomes a ``QuantizedLinear``. A layer whose weight is on the host
(a tiny model, a checkpoint the library converted) is quantized there; one whose
weight is still to be read from the checkpoint (built empty) is quantized by
placement as its rows are read, straight into its shards, with its scales beside it:
no bfloat16 copy of the model is ever whole, on the host or on a device.

Which layers: the recipe's ``include`` and ``exclude`` regexes over module names, or
the family's (``Family.quantize_include``/``quantize_exclude``: the layers inside the
transformer blocks, not the modulation ones); embeddings, norms and the output
projection stay in high precision, as the published ports keep them.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

from porter.errors import RecipeError
from porter.shims import lazy
from porter.transforms import Checking, Pass, sketch, unknown_components
from porter.transforms.quantize.formats import FORMATS, SCALE, resolve

torch = lazy.module("torch", __name__)

if TYPE_CHECKING:
    from porter.errors import Problem
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe
    from porter.runtime import Runtime
    from porter.transforms.building import Building


def components(recipe: Recipe, family: ModelFamily,
               modules: dict | None = None) -> list[str]:
    """The components quantized: the recipe's, or the family's transformers (those the
    model has, when ``modules`` is given)."""
    named = recipe.quantize.components
    if named is not None:
        return list(named)
    found = list(family.stepped_transformers) if family else ["transformer"]
    return [n for n in found if modules is None or n in modules]


def patterns(recipe: Recipe, family: ModelFamily) -> tuple[list[str], list[str]]:
    """(include, exclude) regexes: the recipe's where it gives them, else the family's."""
    section = recipe.quantize
    include = section.include if section.include is not None else family.quantize_include
    exclude = section.exclude if section.exclude is not None else family.quantize_exclude
    return list(include), list(exclude)


def chosen(recipe: Recipe, family: ModelFamily, component: sketch.Sketch) -> list[str]:
    """The names of the component's linear layers (its sketch's) the recipe quantizes,
    in module order."""
    include, exclude = patterns(recipe, family)
    kept = _edge_blocks(component) if recipe.quantize.keep_edge_blocks else ()
    return [path for path in component.linears
            if any(re.fullmatch(rx, path) for rx in include)
            and not any(re.fullmatch(rx, path) for rx in exclude)
            and not any(path.startswith(prefix) for prefix in kept)]


def _edge_blocks(component: sketch.Sketch) -> tuple[str, ...]:
    """The first and last block of each block list, as name prefixes."""
    return tuple(f"{name}.{i}." for name, count in component.blocks
                 for i in {0, count - 1})


def quantized(module: torch.nn.Module, names: list[str], fmt) -> dict:
    """Each named linear layer of ``module`` replaced by a ``QuantizedLinear``; returns
    weight name -> Pending for those whose weights are still to be read (placement
    quantizes them as it reads them)."""
    from porter.transforms.quantize.linear import (
        QuantizedLinear,  # lazy: a torch module
    )

    pending = {}
    for path in names:
        parent_name, _, child = path.rpartition(".")
        parent = module.get_submodule(parent_name)
        dtype = getattr(parent, child).weight.dtype
        layer = QuantizedLinear(getattr(parent, child), fmt)
        setattr(parent, child, layer)
        if layer.weight.is_meta:
            pending[f"{path}.weight"] = Pending(fmt, f"{path}.{SCALE}", dtype)
    return pending


class Pending(NamedTuple):
    """A weight placement quantizes as it reads it."""

    format: object  # formats.Format
    scale: str  # the name of its scales' tensor
    #: the dtype its values are read in first (the recipe's, as the dtypes pass left
    #: it): the same values a weight on the host is quantized from
    dtype: torch.dtype


def chip_format(recipe: Recipe, runtime: Runtime):
    """The recipe's format on ``runtime``'s chip; RecipeError where it gains nothing."""
    fmt, why = resolve(recipe.quantize.format, runtime.platform, runtime.device_kind)
    if fmt is None:
        raise RecipeError([_no_gain(recipe, why)])
    return fmt


def chip_problems(recipe: Recipe, platform: str, device_kind: str) -> list:
    """``chip_format``'s refusal as a problem, for a chip that need not be here
    (``validate`` and ``plan`` with ``--target``)."""
    if recipe_off(recipe):
        return []
    fmt, why = resolve(recipe.quantize.format, platform, device_kind)
    return [] if fmt is not None else [_no_gain(recipe, why)]


def _no_gain(recipe: Recipe, why: str):
    weights_only = {"fp8": "fp8-weights", "int8": "int8-weights"}.get(recipe.quantize.format)
    return recipe.problem(
        "quantize.format", f"{recipe.quantize.format!r} gains nothing here: {why}",
        hint=(f"use {weights_only!r} (halves the weights' memory; matmuls stay in "
              f"{recipe.model.dtype})" if weights_only else
              "name a weights-only format (fp8-weights, int8-weights)"))


def sketched(recipe: Recipe, family: ModelFamily, sketches: dict) -> dict:
    """The component sketches with the recipe's layers quantized as ``quantized`` lays
    them out (an 8-bit weight and its float32 scales, one per row): ``porter plan``'s
    and the memory check's bytes. ``auto`` stands as int8 here: every format stores one
    byte a weight."""
    if recipe_off(recipe):
        return sketches
    fmt = FORMATS.get(recipe.quantize.format, FORMATS["int8"])
    out = dict(sketches)
    for name in components(recipe, family, sketches):
        if name not in sketches:
            continue
        tensors, aliases = dict(sketches[name].tensors), dict(sketches[name].aliases)
        for path in chosen(recipe, family, sketches[name]):
            weight = f"{path}.weight"
            # a tied weight (a language model's output layer and its embedding) is
            # untied: the layer gets 8-bit values of its own, the others keep the tensor
            first = aliases.pop(weight, weight)
            shape = tensors[first].shape
            sharing = [alias for alias, name in aliases.items() if name == weight]
            if first == weight and sharing:  # the first of the others holds it now
                tensors[sharing[0]] = tensors[weight]
                aliases.update({alias: sharing[0] for alias in sharing[1:]})
                del aliases[sharing[0]]
            tensors[weight] = sketch.Tensor(shape, fmt.weight)
            tensors[f"{path}.{SCALE}"] = sketch.Tensor(shape[:1], "float32")
        out[name] = replace(sketches[name], tensors=tensors, aliases=aliases)
    return out


# ------------------------------------------------------------------------- the pass

def _apply(b: Building) -> None:
    if recipe_off(b.recipe):
        return
    fmt = chip_format(b.recipe, b.runtime)
    done = {}
    for name in components(b.recipe, b.family, b.modules):
        names = chosen(b.recipe, b.family, sketch.of(b.modules[name]))
        b.quantize.pending[name] = quantized(b.modules[name], names, fmt)
        done[name] = len(names)
    b.quantize.format, b.quantize.layers = fmt.name, done
    b.say(f"quantizing {sum(done.values())} linear layer(s) to {fmt.name}")


def recipe_off(recipe: Recipe) -> bool:
    return recipe.quantize.format is None


def _check(c: Checking) -> list[Problem]:
    recipe, problems = c.recipe, []
    for key in ("include", "exclude"):
        for i, rx in enumerate(getattr(recipe.quantize, key) or []):
            try:
                re.compile(rx)
            except re.error as exc:
                problems.append(recipe.problem(f"quantize.{key}.{i}",
                                               f"invalid regex: {exc}"))
    if recipe_off(recipe) and (recipe.quantize.include is not None
                               or recipe.quantize.components is not None):
        problems.append(recipe.problem(
            "quantize", "layers are named but no format is given: nothing is quantized",
            hint="add quantize.format (fp8, int8, fp8-weights, int8-weights or auto)"))
    return problems


def _fit(c: Checking) -> list[Problem]:
    recipe, family, modules = c.recipe, c.family, c.modules
    if recipe_off(recipe):
        return []
    names = components(recipe, family, modules)
    problems = unknown_components(recipe, modules, {"quantize.components": names})
    for name in names:
        if name in modules and not chosen(recipe, family, modules[name]):
            where = "quantize.include" if recipe.quantize.include is not None else "quantize"
            problems.append(recipe.problem(
                where, f"{name}: no linear layer matches quantize.include less "
                "quantize.exclude", hint="name layers by their module path, e.g. "
                r"'blocks\.\d+\.ffn\..*' (`porter inspect` lists them)"))
    return problems


def _detail(c: Checking) -> str | None:
    recipe, family, modules = c.recipe, c.family, c.modules
    if recipe_off(recipe):
        return None
    counts = [f"{name} {len(chosen(recipe, family, modules[name]))} linear layer(s)"
              for name in components(recipe, family, modules) if name in modules]
    edges = ", first and last blocks kept" if recipe.quantize.keep_edge_blocks else ""
    return f"{recipe.quantize.format}: {', '.join(counts)}{edges}"


PASS = Pass(
    "quantize", ("quantize",), "linear layers' weights to 8 bits (per output channel) "
    "and, for fp8 and int8, their matmuls on 8-bit operands (activations per token)",
    check=_check, fit=_fit, apply=_apply, abstract=_apply, detail=_detail)

__all__ = ["FORMATS", "PASS", "chosen", "components", "quantized", "sketched"]
