"""The port's passes, in the order a run applies them: the one table that `validate`,
`plan`, `run` and `compile` read.

Each pass names the recipe sections it reads and says what it does, and has up to
four parts, each optional:

- ``check(recipe, registry, family)``: problems the recipe alone shows (no model, no
  JAX). ``porter validate`` and every command that loads a model run these first;
  ``family`` is None when the recipe names an unknown family.
- ``fit(recipe, family, modules, axes)``: problems against the model's shapes
  (``modules``: the components built on the meta device; ``axes``: the mesh).
  ``validate`` and ``plan`` run these before any weight is read, and ``build`` runs
  them again on the model as loaded, before any weight moves (a hub id with no
  configuration is known only then).
- ``apply(building)``: what ``porter run`` does, on the loaded pipeline.
- ``abstract(building)``: what ``porter compile`` does, on meta models whose every
  tensor becomes a ``jax.ShapeDtypeStruct`` (None: the pass changes nothing a compiled
  program takes, as LoRA fused into the weights).

The first passes work on the host (``HOST``); the rest (``MESH``, from placement on)
need the mesh: ``port`` applies those to a pipeline loaded some other way (``porter
verify`` and ``porter bench`` keep a PyTorch copy of it first).

A new pass is a row here, with its work in its own module (``porter/transforms/``).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from porter import stepcache as cache, loading
from porter.transforms import patches
from porter.port import porting
from porter.loading import abstract
from porter.transforms import attention, dtypes, lora, placement, rotary, sharding
from porter.transforms.compile import scan
from porter.errors import RecipeError, UsageError
from porter.shims.interop import to_device
from porter.transforms import compile as compile_transform
from porter.transforms import setup as setup_transform


@dataclass(frozen=True)
class Pass:
    name: str
    reads: tuple[str, ...]  # the recipe's sections
    does: str  # one line, for `porter plan` and the docs
    check: Callable | None = None
    fit: Callable | None = None
    apply: Callable | None = None
    abstract: Callable | None = None
    #: (recipe, registry, family, modules) -> what this recipe asks of the pass, in a
    #: few words (``porter plan``); None: nothing, the pass is skipped
    detail: Callable | None = None


def _quiet(message: str) -> None:
    """A ``say`` that says nothing."""


@dataclass
class Building:
    """A port while its passes run: what each pass needs from the ones before it."""

    recipe: object
    registry: object
    family: object
    runtime: object  # porter.runtime.Runtime: the mesh (a target's deviceless one)
    say: Callable = _quiet  # status lines, for a run with progress shown
    #: contexts held until the port is built (the patches, while the model loads)
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    pipe: object = None
    modules: dict = field(default_factory=dict)  # torch components, as loaded
    weights: dict = field(default_factory=dict)  # component -> ComponentWeights (empty)
    checkpoint: dict = field(default_factory=dict)  # what names it, for the record
    chosen: list = field(default_factory=list)  # the patches applied
    timings: dict = field(default_factory=dict)
    placed: dict = field(default_factory=dict)  # component -> placement.report
    assignments: dict = field(default_factory=dict)  # component -> [sharding.Assignment]
    unsharded: set = field(default_factory=set)  # no weight, no activation rule
    rules: dict = field(default_factory=dict)  # component -> CompileRule (compiled ones)
    one_device: set = field(default_factory=set)  # compiled, run on one device
    scanned: dict = field(default_factory=dict)  # component -> block lists as one scan
    traces: object = None  # TraceCache (None: the compile cache is off)
    splits: dict = field(default_factory=dict)  # component -> autosplit.Split
    caching: object = None  # porter.stepcache.session.Caching, with a ``cache:`` section
    #: the components a step cache compiles in pieces (block by block), found from the
    #: modules as loaded (compiled in pieces, their children are programs)
    in_pieces: list = field(default_factory=list)

    def ported(self) -> "porting.Ported":
        return porting.Ported(self.traces, self.placed, self.splits, self.caching)


# ---------------------------------------------------------------------------- patches

def _select_patches(b: Building) -> None:
    b.chosen = porting.selected_patches(b.recipe, b.registry, b.family)
    b.stack.enter_context(patches.applied(b.chosen))


def _patches_detail(recipe, registry, family, modules):
    return ", ".join(patch.name for patch, _ in
                     porting.selected_patches(recipe, registry, family))


# ---------------------------------------------------------------------------- load

def _load(b: Building) -> None:
    b.say(f"loading {b.family.name} from {b.recipe.model.source} ({b.recipe.model.dtype})")
    b.pipe, b.weights, b.checkpoint = loading.load_for_port(b.family, b.recipe)
    b.modules = _torch_components(b.pipe.components)


def _load_abstract(b: Building) -> None:
    modules = abstract.components(b.family, b.recipe)
    if modules is None:
        raise UsageError(f"cannot compile {b.recipe.model.source!r} without its "
                         "configuration", hint="point model.source at a local diffusers "
                         "directory (configuration files are enough)")
    b.pipe, b.modules = MetaPipeline(modules), modules


class MetaPipeline:
    """Meta components standing in for a pipeline: what set-up calls and rotary tables
    reach (``pipe.transformer``, ``pipe.components``)."""

    def __init__(self, modules: dict):
        self.components = modules
        self.__dict__.update(modules)


def _torch_components(components: dict) -> dict:
    return {n: c for n, c in components.items() if isinstance(c, torch.nn.Module)}


def _size_fit(recipe, family, modules, axes):
    transformer = modules.get("transformer")
    return [] if transformer is None else family.size_problems(recipe, transformer.config)


# ---------------------------------------------------------------------------- setup

def _set_up(b: Building) -> None:
    done = setup_transform.apply(b.pipe, b.recipe)
    if done:
        b.say(f"set up: {', '.join(done)}")


def _setup_detail(recipe, registry, family, modules):
    return ", ".join(f"{component}.{name}" for component, _, name, _ in
                     setup_transform.calls(recipe)) or None


# ---------------------------------------------------------------------------- LoRA

def _fuse_lora(b: Building) -> None:
    adapters = lora.apply(b.family, b.recipe, b.pipe, b.weights)  # before any dtype cast
    if adapters:
        b.checkpoint["lora"] = adapters


def _lora_detail(recipe, registry, family, modules):
    return ", ".join(f"{spec.file} x{spec.scale}" for spec in recipe.lora) or None


# ---------------------------------------------------------------------------- dtypes

def _cast(b: Building) -> None:
    dtypes.apply_all(b.modules, b.recipe)


def _dtypes_fit(recipe, family, modules, axes):
    found = _unknown_components(recipe, modules, {
        "dtypes.overrides": recipe.dtypes.overrides,
        "dtypes.components": recipe.dtypes.components})
    for name, module in modules.items():
        found += dtypes.unmatched_problems(recipe, name, module)
    return found


def _dtypes_detail(recipe, registry, family, modules):
    parts = [recipe.model.dtype]
    parts += [f"{name} {dtype}" for name, dtype in recipe.dtypes.components.items()]
    kept = sum(len(rules) for rules in recipe.dtypes.overrides.values())
    if kept:
        parts.append(f"{kept} override rule(s)")
    return ", ".join(parts)


# ---------------------------------------------------------------------------- placement

def _place(b: Building) -> None:
    b.say("placing weights on the mesh" + (
        f" ({', '.join(b.weights)} read from the checkpoint tensor by tensor)"
        if b.weights else ""))
    nonfinite = {}
    for name, component in b.modules.items():
        found: dict = {}
        assignments = placement.apply(component, b.runtime, _weight_rules(b.recipe, name),
                                      b.weights.get(name), found)
        nonfinite.update({f"{name}.{tensor}": count for tensor, count in found.items()})
        b.placed[name] = placement.report(component, assignments, b.runtime.axes,
                                          b.weights.get(name))
        _constrain(b, name, component, assignments)
    porting.refuse_nonfinite(nonfinite, b.recipe)


def _assign(b: Building) -> None:
    for name, module in b.modules.items():
        assignments = sharding.assign(sharding.named_tensors(module),
                                      _weight_rules(b.recipe, name))
        b.assignments[name] = assignments
        _constrain(b, name, module, assignments)


def _weight_rules(recipe, name: str) -> list:
    return recipe.sharding.weights.get(name, [])


def _constrain(b: Building, name: str, module, assignments) -> None:
    """The recipe's activation shardings on ``module``; a component no rule shards is
    remembered (compiled whole, it runs on one device)."""
    activations = b.recipe.sharding.activations.get(name, [])
    sharding.constrain_activations(module, b.runtime, activations)
    if placement.unsharded(assignments, activations):
        b.unsharded.add(name)


def _placement_fit(recipe, family, modules, axes):
    found = _unknown_components(recipe, modules, {
        "sharding.weights": recipe.sharding.weights,
        "sharding.activations": recipe.sharding.activations})
    for name, module in modules.items():
        assignments = sharding.assign(sharding.named_tensors(module),
                                      _weight_rules(recipe, name))
        found += sharding.shape_problems(recipe, name, assignments, axes)
    transformer = modules.get("transformer")
    if transformer is not None:
        shapes = family.transformer_inputs(recipe, transformer.config)
        found += sharding.input_problems(recipe, shapes, axes)
    return found


def _placement_detail(recipe, registry, family, modules):
    weights = sum(len(rules) for rules in recipe.sharding.weights.values())
    activations = sum(len(rules) for rules in recipe.sharding.activations.values())
    mesh = " x ".join(f"{axis}={size}" for axis, size in recipe.mesh.items())
    return (f"mesh {mesh}: {weights} weight rule(s), {activations} activation rule(s)"
            + (", transformer inputs sharded" if recipe.sharding.inputs else ""))


# ---------------------------------------------------------------------------- rotary

def _rotary(b: Building) -> None:
    if b.recipe.rotary.precompute:
        rotary.apply(b.pipe, b.family, b.recipe, lambda table: to_device(table, b.runtime))


def _rotary_abstract(b: Building) -> None:
    if b.recipe.rotary.precompute:  # the tables' buffers: shapes only here
        rotary.apply(b.pipe, b.family, b.recipe, lambda table: table.to("meta"))


def _rotary_check(recipe, registry, family):
    if family is None or not recipe.rotary.precompute \
            or family.rotary_patch_for(recipe) is not None:
        return []
    return [recipe.problem("rotary.precompute", f"family {family.name!r} has no rotary "
                           "cache", hint="set it to false")]


def _rotary_detail(recipe, registry, family, modules):
    return "tables computed once, on the host, outside the compiled programs" \
        if recipe.rotary.precompute else None


# ---------------------------------------------------------------------------- compile

def _compile(b: Building) -> None:
    """Wrap each compiled component: its programs are traced and compiled on first use."""
    b.rules = compile_transform.rules(b.recipe, b.family, b.runtime.platform)
    b.traces = porting.trace_cache(b.recipe, b.family, b.runtime)
    in_pieces = b.in_pieces
    for name, rule in b.rules.items():
        if name not in b.modules:
            continue
        compiler = compile_transform.pieces if name in in_pieces else compile_transform.apply
        component = compiler(b.modules[name], rule, b.traces, name, b.runtime.xla_options,
                             b.splits)
        if porting.takes_sharded_inputs(name, b.recipe):
            component = sharding.ShardedInputs(component, b.recipe.sharding.inputs,
                                               b.runtime)
        elif _runs_on_one_device(b, name):
            placement.on_one_device(component, b.runtime)
            b.one_device.add(name)
        setattr(b.pipe, name, component)


def _compile_abstract(b: Building) -> None:
    b.rules = compile_transform.rules(b.recipe, b.family, b.runtime.platform)
    in_pieces = b.in_pieces
    for name, rule in b.rules.items():
        if name not in b.modules:
            continue
        if _runs_on_one_device(b, name):
            b.one_device.add(name)
        if rule.scan and rule.modules is None and name not in in_pieces:
            b.scanned[name] = scan.identical_lists(b.modules[name])


def _runs_on_one_device(b: Building, name: str) -> bool:
    return porting.runs_on_one_device(name, b.recipe, b.rules[name],
                                      b.runtime.mesh.devices.size, name in b.unsharded,
                                      name in b.in_pieces)


def _compile_detail(recipe, registry, family, modules):
    rules = compile_transform.rules(recipe, family, None)
    return ", ".join(f"{name}.{'/'.join(rule.methods)}"
                     + (f" (submodules {rule.modules})" if rule.modules else "")
                     for name, rule in rules.items() if name in modules) or None


# ---------------------------------------------------------------------------- attention

def _skip_attention(b: Building) -> None:
    """Components the recipe's ``attention.skip`` names, and those run on one device,
    run with torchax's own attention (wrapping the compiled component: its programs are
    traced inside the wrapper). A backend shards attention over the mesh, which the
    inputs of a one-device component (a CLIP image encoder) are not on."""
    for name in attention_skipped(b):
        setattr(b.pipe, name, attention.Skipped(getattr(b.pipe, name)))


def attention_skipped(b: Building) -> list[str]:
    """The components that run with torchax's own attention, not the recipe's backend
    (none without one: nothing is wrapped). A component run on one device is among them
    when the backend shards attention over the mesh (``data_axis``, ``head_axis``):
    its inputs are on one device, not the mesh; unsharded, the kernel runs there."""
    section = b.recipe.attention
    if section.backend is None:
        return []
    sharded = section.data_axis is not None or section.head_axis is not None
    return [name for name in b.modules
            if name in section.skip or (sharded and name in b.one_device)]


def _attention_detail(recipe, registry, family, modules):
    section = recipe.attention
    if section.backend is None:
        return None
    return section.backend + (f", skipped in {', '.join(section.skip)}"
                              if section.skip else "")


# ---------------------------------------------------------------------------- cache

def _start_cache(b: Building) -> None:
    if b.recipe.cache:
        from porter.stepcache.session import Caching
        b.caching = Caching(cache.settings(b.recipe),
                            {name: b.modules[name] for name in b.in_pieces}, b.recipe)


def _cache_detail(recipe, registry, family, modules):
    chosen = cache.settings(recipe)
    return None if chosen is None else chosen.method


# ---------------------------------------------------------------------------- the table

def _unknown_components(recipe, modules: dict, sections: dict) -> list:
    """Rules for a component the model does not have: a typo, or the wrong model."""
    return [recipe.problem(f"{path}.{name}", f"the model has no component {name!r}",
                           hint=f"components: {', '.join(sorted(modules))}")
            for path, per_component in sections.items() for name in per_component
            if name not in modules]


HOST = (
    Pass("patches", ("patches", "rotary.precompute"), "replace code JAX cannot trace (the "
         "core's, the family's and the recipe's patches), held while the model loads",
         check=lambda recipe, registry, family: patches.problems(recipe, registry),
         apply=_select_patches, abstract=_select_patches, detail=_patches_detail),
    Pass("load", ("model",), "build the pipeline on the host; components whose checkpoint "
         "files hold exactly their tensors are built empty and read at placement",
         check=lambda recipe, registry, family: loading.source_problems(recipe),
         fit=_size_fit, apply=_load, abstract=_load_abstract,
         detail=lambda recipe, registry, family, modules: recipe.model.source),
    Pass("setup", ("setup",), "call the set-up methods the recipe names (VAE tiling, ...)",
         fit=lambda recipe, family, modules, axes: setup_transform.problems(recipe, modules),
         apply=_set_up, abstract=_set_up, detail=_setup_detail),
    # its adapters are checked against the model by `validate` (checks.validate) and
    # when fused, not in every shape check: reading them means hashing their files
    Pass("lora", ("lora",), "fuse LoRA adapters into the weights, before any dtype cast",
         apply=_fuse_lora, detail=_lora_detail),
    Pass("dtypes", ("model.dtype", "dtypes"), "cast each component, keeping the tensors "
         "the overrides name in their own dtype",
         check=lambda recipe, registry, family: dtypes.rule_problems(recipe),
         fit=_dtypes_fit, apply=_cast, abstract=_cast, detail=_dtypes_detail),
)

MESH = (
    Pass("placement", ("mesh", "sharding"), "place every weight on the mesh in its "
         "sharding (read straight into shards where built empty); constrain activations",
         check=lambda recipe, registry, family: sharding.rule_problems(recipe),
         fit=_placement_fit, apply=_place, abstract=_assign, detail=_placement_detail),
    Pass("rotary", ("rotary",), "compute the rotary tables once and hand them to the "
         "model, instead of computing them inside every program",
         check=_rotary_check, apply=_rotary, abstract=_rotary_abstract,
         detail=_rotary_detail),
    Pass("compile", ("compile",), "compile the components' methods with jax.jit through "
         "torchax (whole, as a scan over identical blocks, or in pieces for a step cache)",
         fit=lambda recipe, family, modules, axes: compile_transform.problems(
             recipe, family, modules),
         apply=_compile, abstract=_compile_abstract, detail=_compile_detail),
    Pass("attention", ("attention",), "attention through the recipe's backend while "
         "programs are traced (installed around each call)",
         check=lambda recipe, registry, family: attention.problems(recipe, registry),
         apply=_skip_attention, detail=_attention_detail),
    Pass("cache", ("cache",), "a step cache's hooks on the transformers compiled in pieces",
         check=lambda recipe, registry, family: [] if family is None
         else cache.problems(recipe, family),
         fit=lambda recipe, family, modules, axes: porting.cache_fit_problems(
             recipe, family, modules),
         apply=_start_cache, detail=_cache_detail),
)

PASSES = HOST + MESH


def check_problems(recipe, registry, family) -> list:
    """Every pass's ``check``: what the recipe alone shows."""
    return [problem for step in PASSES if step.check
            for problem in step.check(recipe, registry, family)]


def fit_problems(recipe, family, modules: dict, axes: dict, passes=None) -> list:
    """Every pass's ``fit`` (or those of ``passes``): the recipe against the model's
    shapes on ``axes``."""
    return [problem for step in (PASSES if passes is None else passes) if step.fit
            for problem in step.fit(recipe, family, modules, axes)]


def details(recipe, registry, family, modules: dict) -> list[dict]:
    """What each pass does for this recipe and model, in order (``porter plan``)."""
    rows = []
    for step in PASSES:
        detail = step.detail(recipe, registry, family, modules) if step.detail else None
        rows.append({"pass": step.name, "reads": list(step.reads), "does": step.does,
                     "applies": bool(detail), "detail": detail or ""})
    return rows


def build(b: Building, abstract: bool = False) -> Building:
    """Every pass, in order (``abstract``: as ``porter compile`` does); the patches stay
    applied until ``b.stack`` is closed. The fits run again on the model as loaded,
    before any weight moves: where no configuration was at hand before loading (a hub
    id), this is where they are first checked."""
    start = time.perf_counter()
    for step in HOST:
        _apply(step, b, abstract)
    b.timings["load_s"] = round(time.perf_counter() - start, 4)  # LoRA, dtypes too
    problems = fit_problems(b.recipe, b.family, b.modules, b.runtime.axes)
    if problems:
        raise RecipeError(problems)
    return port(b, abstract)


def port(b: Building, abstract: bool = False) -> Building:
    """The mesh passes on ``b.pipe`` (loaded, its LoRA fused and dtypes cast)."""
    if not b.modules:
        b.modules = _torch_components(b.pipe.components)
    b.in_pieces = porting.piece_components(b.recipe, b.modules)
    start = time.perf_counter()
    for step in MESH:
        _apply(step, b, abstract)
    b.timings["to_jax_s"] = round(time.perf_counter() - start, 4)
    return b


def ported(pipe, family, runtime, recipe, weights: dict | None = None) -> "porting.Ported":
    """The mesh passes on a pipeline loaded otherwise (its LoRA fused, dtypes cast):
    ``weights``, component -> ComponentWeights, for components built empty."""
    b = Building(recipe, None, family, runtime, pipe=pipe, weights=weights or {})
    return port(b).ported()


def _apply(step: Pass, b: Building, abstract: bool) -> None:
    work = step.abstract if abstract else step.apply
    if work is not None:
        work(b)


__all__ = ["Building", "HOST", "MESH", "PASSES", "Pass", "build", "check_problems",
           "details", "fit_problems", "port", "ported"]
