"""`porter verify`: the ported transformer beside PyTorch, module by module.

The reference is the recipe's transformer as loaded, in float32, run eagerly
by PyTorch on the CPU (``--sharded``: the same port on a one-device mesh). The
ported transformer (the recipe's dtypes, sharding, patches, rotary cache and
attention) runs on identical random inputs twice: eagerly through torchax,
so a hook on every module named by ``verify.modules`` can see its output, and
compiled, for the final output the run actually uses.
"""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from porter import loading
from porter import recipe as recipe_mod
from porter import runtime as runtime_mod
from porter.errors import RecipeError
from porter.port import active, beside, checks
from porter.shims.interop import to_device, to_host
from porter.stepcache import without_cache
from porter.transforms import jit
from porter.transforms import dtypes, patches, quantize

if TYPE_CHECKING:
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe
    from porter.registry import Registry
    from porter.runtime import Runtime

DEFAULT_TOLERANCE = {"float32": 1e-5, "bfloat16": 5e-2, "float16": 5e-2}


def tolerance(recipe: Recipe, registry: Registry) -> float:
    """The recipe's ``verify.tolerance``, else its dtype's, widened to its quantization
    format's bound (``auto``: the widest, as the chip decides the format) and to its
    attention backends' (an approximate kernel's, e.g. fp8 attention)."""
    if recipe.verify.tolerance:
        return recipe.verify.tolerance
    fmt = recipe.quantize.format
    formats = list(quantize.FORMATS.values()) if fmt == "auto" else \
        [quantize.FORMATS[fmt]] if fmt else []
    section = recipe.attention
    kernels = [registry.attention.get(name) for name in (section.backend, section.cross_backend)]
    return max([DEFAULT_TOLERANCE[recipe.model.dtype], *(f.tolerance for f in formats),
                *(kernel.tolerance for kernel in kernels if kernel)])


def _check_matches(recipe: Recipe, module) -> None:
    """``verify.modules`` names at least one module: a pattern that matches none would
    compare the output alone, and say nothing of why."""
    pattern = recipe.verify.modules
    names = [name for name, _ in module.named_modules() if name]
    if not recipe.sets("verify.modules") or any(re.fullmatch(pattern, n) for n in names):
        return  # the default (Wan's blocks) compares the output alone elsewhere
    top = [name for name in names if "." not in name]
    first = next((name for name in names  # a list's first (blocks.0)
                  if name.count(".") == 1 and name.split(".")[1].isdigit()), None)
    raise RecipeError([recipe.problem(
        "verify.modules", f"no module of the transformer is named '{pattern}' (a "
        "regex over whole names)", hint="its modules are named like "
        + ", ".join(top[:8] + ([first] if first else [])))])


def _record(module, pattern: str, store: dict, convert) -> list:
    handles = []
    for name, sub in module.named_modules():
        if name and re.fullmatch(pattern, name):
            def hook(_m, _i, output, name=name):
                value = output[0] if isinstance(output, tuple) else output
                store[name] = convert(value)
            handles.append(sub.register_forward_hook(hook))
    return handles


def _compare(expected: torch.Tensor, got: torch.Tensor) -> dict:
    """Max error, relative to the reference's largest value, and the cosine of the
    two as vectors (what quantization's published gates are given in)."""
    expected, got = expected.double(), got.double()
    diff = (got - expected).abs().max().item()
    scale = expected.abs().max().item() or 1.0
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), expected.flatten(),
                                                   dim=0).item()
    return {"max_abs": diff, "max_rel": diff / scale, "cosine": cosine}


def _unwrap(component):
    """The torch module inside porter's wrappers (sharded inputs, skipped attention, jit)."""
    while True:
        inner = vars(component).get("module") or vars(component).get("_target")
        if inner is None:
            return getattr(component, "_model", component)  # torchax's jit wrapper
        component = inner


def _single_device(runtime: Runtime):
    import jax
    devices = np.array(jax.devices()[:1]).reshape((1,) * len(runtime.axes))
    return replace(runtime, mesh=jax.sharding.Mesh(devices, tuple(runtime.axes)))


def _ported(family: ModelFamily, recipe: Recipe, registry: Registry, runtime: Runtime):
    """The recipe's pipeline ported to ``runtime``: (pipe, eager transformer, its
    PyTorch copy before the recipe's dtypes, what its calls run inside)."""
    pipe = loading.load_untouched(family, recipe)
    host = copy.deepcopy(pipe.transformer)  # before the recipe's dtypes: the reference
    dtypes.apply_all(pipe.components, recipe)
    calling = beside.ported(pipe, recipe, registry, runtime)
    return pipe, _unwrap(pipe.transformer), host, calling


def _run_ported(module, compiled, inputs, runtime: Runtime, recorded):
    """Module outputs (eager, hooked) and the compiled final output, on the host: the
    caller installs the recipe's ops; ``recorded`` names the modules to hook."""
    placed = {k: to_device(v, runtime) for k, v in inputs.items()}
    outputs: dict = {}
    with runtime.env:
        handles = _record(module, recorded, outputs, to_host)
        try:
            module(return_dict=False, **placed)  # eager: hooks see concrete values
        finally:
            for handle in handles:
                handle.remove()
        final = compiled(return_dict=False, **placed)[0]
    return outputs, to_host(final)


def unscanned(recipe: Recipe, registry: Registry):
    """The recipe with its transformers' blocks compiled one by one, not as a scan: the
    eager pass hooks each block, which a scan runs over stacked weights instead (tests
    hold the scan equal to the blocks one by one)."""

    family = registry.families.get(recipe.model.family)
    if family is None:
        return recipe
    rules = jit.rules(recipe, family, None)
    scanned = {name: rule for name, rule in rules.items() if rule.scan}
    if not scanned:
        return recipe
    data = recipe.resolved()
    for name, rule in scanned.items():
        data.setdefault("compile", {})[name] = {**rule.model_dump(), "scan": False}
    return recipe_mod.validate_data(data, dict(recipe._locations), recipe.path)


def verify(recipe: Recipe, registry: Registry, sharded: bool = False) -> dict:
    """Compare the port with PyTorch (or, ``sharded``, with itself on one device); a
    step cache is left out (it changes which blocks run, not how they compute), and the
    blocks are compiled one by one (``unscanned``)."""
    recipe = unscanned(without_cache(recipe), registry)
    family = checks.checked_family(recipe, registry)
    beside.refuse_undescribed(family, "verify")
    runtime = runtime_mod.start(recipe)
    checks.check_platform(recipe, registry, runtime)
    loading.abstract.import_classes(family, recipe)  # before the patches, as a run's build
    with patches.applied(patches.selected(recipe, registry, family)):
        pipe, module, host, calling = _ported(family, recipe, registry, runtime)
        _check_matches(recipe, host)
        dtype = module.dtype
        inputs = beside.random_inputs(family, recipe, module.config)
        ported_inputs = beside.cast(inputs, dtype)
        with active.transformer_calls(calling):
            got, final = _run_ported(module, pipe.transformer, ported_inputs, runtime,
                                     recipe.verify.modules)
        if sharded:
            single = _single_device(runtime)
            pipe_1, module_1, _, calling_1 = _ported(family, recipe, registry, single)
            with active.transformer_calls(calling_1):
                expected, expected_final = _run_ported(
                    module_1, pipe_1.transformer, ported_inputs, single,
                    recipe.verify.modules)
        else:
            reference = host.float().eval()
            expected = {}
            handles = _record(reference, recipe.verify.modules, expected,
                              lambda t: t.detach().float())
            with torch.no_grad():
                expected_final = reference(return_dict=False, **inputs)[0]
            for handle in handles:
                handle.remove()
    return report(recipe, registry, expected, got, expected_final, final, sharded)


def report(recipe: Recipe, registry: Registry, expected: dict, got: dict, expected_final,
           final,
           sharded) -> dict:
    limit = tolerance(recipe, registry)
    rows = []
    for name in expected:
        if name in got:
            rows.append({"module": name, **_compare(expected[name], got[name].float())})
    for row in rows:
        row["ok"] = row["max_rel"] <= limit
    final_row = {"module": "output", **_compare(expected_final.float(), final.float())}
    final_row["ok"] = final_row["max_rel"] <= limit
    first_bad = next((row["module"] for row in rows if not row["ok"]), None)
    return {"recipe": recipe.name, "against": "unsharded port" if sharded else
            "PyTorch float32 (CPU, eager)", "tolerance": limit, "modules": rows,
            "first_over_tolerance": first_bad, "output": final_row,
            "ok": final_row["ok"] and first_bad is None}


def render(result: dict) -> str:
    lines = [f"verify {result['recipe']} against {result['against']}, "
             f"tolerance {result['tolerance']:.0e} (max |diff| / max |reference|)",
             f"{'module':<28} {'max abs':>11} {'max rel':>11} {'cosine':>10}"]
    for row in result["modules"] + [result["output"]]:
        flag = "" if row["ok"] else "   OVER"
        lines.append(f"{row['module']:<28} {row['max_abs']:>11.3e} {row['max_rel']:>11.3e}"
                     f" {row['cosine']:>10.6f}{flag}")
    if result["first_over_tolerance"]:
        lines.append(f"first module over tolerance: {result['first_over_tolerance']}")
    lines.append("ok" if result["ok"] else "FAILED")
    return "\n".join(lines)
