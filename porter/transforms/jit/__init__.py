"""The compile pass: pipeline components compiled with jax.jit through torchax, as the
recipe says: whole, a transformer's identical blocks as one scan (``scan``), what cannot
be traced whole split into what can (``autosplit``), or in pieces for a step cache;
traced programs kept on disk (``traces``)."""

from __future__ import annotations

import functools
import types
from typing import TYPE_CHECKING

from porter.recipe.schema import CompileRule
from porter.shims.compat import import_torchax
from porter.shims.walk import block_lists
from porter.transforms import CALL, Calling, Checking, Pass, placement, sharding
from porter.transforms.building import Jitted
from porter.transforms.jit import autosplit
from porter.transforms.jit import traces as traces_mod

if TYPE_CHECKING:
    from porter.errors import Problem
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe
    from porter.transforms.building import Building


def rules(recipe: Recipe, family: ModelFamily, platform: str | None) -> dict[str,
          CompileRule]:
    """Component -> how to compile it: the family's defaults, then the recipe's.

    Whether a transformer's blocks compile as a scan is the recipe's say, else the
    family's for an accelerator (``platform`` is where the programs run: ``None`` for
    any). A scan trades stacking the weights once per run for a program that compiles
    in a fraction of the time; on the CPU backend that trade loses (Wan 1.3B on 8
    virtual CPU devices: 26 s instead of 4.6 s to stack, 1.5 GiB more peak memory,
    9 s less to compile; measured), so CPU runs trace the blocks one by one."""
    plan = {name: CompileRule(methods=list(methods))
            for name, methods in family.compiled.items()}
    plan.update(recipe.compile)
    resolved = {}
    for name, rule in plan.items():
        if rule.scan is None:
            default = family.scan_blocks and platform != "cpu" \
                and name.startswith("transformer") and rule.modules is None \
                and not _block_cache(recipe)
            rule = rule.model_copy(update={"scan": default})
        resolved[name] = rule
    return {name: rule for name, rule in resolved.items() if rule.methods}


def _block_cache(recipe: Recipe) -> bool:
    """Does a step cache run the transformers in pieces, block by block (no scan there)?
    The guidance cache skips whole calls, not blocks."""
    return bool(recipe.cache) and recipe.cache.get("method") != "guidance"


def in_pieces(recipe: Recipe, modules: dict, lists=block_lists) -> list[str]:
    """The components a step cache works on, each compiled in pieces (each child and
    each block: its decisions fall between programs): the transformers with a block
    list, when the recipe's cache skips blocks (the guidance cache skips whole calls).
    ``lists``: a module's block lists (a sketch's: ``Sketch.blocks``)."""
    if not _block_cache(recipe):
        return []
    return [name for name, module in modules.items()
            if name.startswith("transformer") and lists(module)]


def apply(module, rule: CompileRule, traces=None, name: str = "", xla_options=None,
          splits: dict | None = None, functions: dict | None = None):
    """A module whose ``rule.methods`` are jitted once per input shape and static
    arguments (``porter.transforms.jit.autosplit``: arguments that hold no tensor are
    static); with ``rule.modules``, the module itself stays eager and each matching
    submodule is jitted instead. What cannot be traced whole is split automatically
    and ``splits[name]`` (a ``Split``) says how. ``traces`` (a TraceCache) keeps the
    traced programs, and the splits, on disk; ``xla_options`` are XLA's compiler
    options for every program. ``functions`` (name -> ``function(module, ...)``: a
    family's ``compiled_functions``) become compiled methods of the module too."""
    split = _prepared(rule, traces, name, xla_options, splits)
    no_cache(module)
    if rule.modules is not None:
        return _compile_submodules(module, rule, split)
    return _jit(module, rule, split, functions or {})


def pieces(module, rule: CompileRule, traces=None, name: str = "", xla_options=None,
           splits: dict | None = None):
    """``module`` with each child that holds weights compiled in place (each block of
    a block list its own program), its forward left to run on the host between them:
    what a step cache needs to decide, between programs, which ones to run."""
    split = _prepared(rule, traces, name, xla_options, splits)
    autosplit.split_children(module, "", split)
    return module


def _prepared(rule: CompileRule, traces, name: str, xla_options, splits):
    """The component's Split, with jax.jit's arguments for ``rule``."""
    output_classes_as_pytrees()
    jit_kwargs = {"static_argnames": tuple(rule.static_argnames)}
    if rule.donate_argnames:
        jit_kwargs["donate_argnames"] = tuple(rule.donate_argnames)
    if xla_options:
        jit_kwargs["compiler_options"] = dict(xla_options)
    split = autosplit.Split.remembered(name, traces, jit_kwargs)
    if splits is not None:
        splits[name] = split
    return split


_REGISTERED: set = set()


def output_classes_as_pytrees() -> None:
    """Let a compiled method return diffusers' and transformers' output classes
    (``DecoderOutput``, ``Transformer2DModelOutput``, ...: what a pipeline gets when
    it calls ``vae.decode(x)`` without ``return_dict=False``). Both libraries register
    them as PyTorch pytrees; JAX, which sees a jitted function's outputs, needs them
    too. Classes defined so far are registered, each once."""
    import json

    import jax
    from diffusers.utils import BaseOutput
    from transformers.utils import ModelOutput

    pending = [BaseOutput, ModelOutput]
    while pending:
        cls = pending.pop()
        pending += cls.__subclasses__()
        if cls in _REGISTERED or cls in (BaseOutput, ModelOutput):
            continue
        _REGISTERED.add(cls)
        jax.tree_util.register_pytree_node(
            cls, lambda out: (tuple(out.values()), tuple(out.keys())),
            lambda keys, values, cls=cls: cls(**dict(zip(keys, values))))
        # and for jax.export, so the trace cache keeps programs that return them
        jax.export.register_pytree_node_serialization(
            cls, serialized_name=f"{cls.__module__}.{cls.__qualname__}",
            serialize_auxdata=lambda keys: json.dumps(list(keys)).encode(),
            deserialize_auxdata=lambda data: tuple(json.loads(data)))


def no_cache(module) -> None:
    """A transformers language model used as a text encoder keeps no key/value cache:
    its forward would return one (a ``DynamicCache``, the default ``use_cache`` of
    Gemma, Llama, Qwen), which no compiled program can return, and no pipeline reads
    it from an encoder's call. A call that asks for a cache (``generate``) still
    gets one."""
    config = getattr(module, "config", None)
    text = getattr(config, "get_text_config", None)  # a multimodal model's language model
    for part in (config, text(decoder=True) if callable(text) else None):
        if getattr(part, "use_cache", False) is True:
            part.use_cache = False


def _compile_submodules(module, rule: CompileRule, split):
    import re

    for path, sub in module.named_modules():
        if path and re.fullmatch(rule.modules, path):
            autosplit.compile_in_place(sub, path, split)
    return module


def _jit(module, rule: CompileRule, split, functions: dict):
    """torchax's JittableModule for ``module`` (weights as inputs of every program),
    each of ``rule.methods`` (and of ``functions``) a call that splits the module if it
    cannot be traced; with ``rule.scan``, each list of identical blocks stacked and run
    as one scan."""

    # lazy: its stand-in block list is a torch module, defined at import; checks need none
    from porter.transforms.jit import scan

    torchax = import_torchax()
    compiled = torchax.compile(module, torchax.CompileOptions(methods_to_compile=[]))
    lists = scan.identical_lists(module) if rule.scan else []
    if lists:  # the module's functional call now takes the stacked weights
        scan.stack_in_place(compiled, lists)
        compiled.functional_call = scan.scanned_call(compiled.functional_call, module, lists)
    methods = present(module, rule.methods)
    for method in methods:
        compiled._jitted[method] = _signed(
            _whole(compiled, method, split, lists), getattr(module, method))
    for name, function in functions.items():
        compiled._jitted[name] = _whole(compiled, function, split, lists, name)
    for public in wrappers(module, methods):
        setattr(compiled, public, types.MethodType(getattr(type(module), public), compiled))
    compiled.train(module.training)  # what a wrapper reads as self.training
    # pipelines read their components' signatures (Stable Video Diffusion asks its VAE's
    # forward whether it takes num_frames) and call nn.Module's buffers(), which the
    # compiled module holds as a dict of that name
    compiled.forward = _signed(compiled.forward, module.forward)
    _register_buffers()
    compiled.buffers = Buffers(compiled.buffers)
    return compiled


def present(module, methods) -> list[str]:
    """The ``methods`` ``module`` has: a family's defaults name methods some of its
    components lack (the generic family's VAEs: ``_encode`` in most, not in Stable
    Video Diffusion's); a recipe's own are checked before (``problems``)."""
    return [m for m in methods if callable(getattr(module, m, None))]


def wrappers(module, methods) -> list[str]:
    """The public methods of ``module`` that wrap a compiled private one and are not
    compiled themselves: diffusers' VAEs wrap ``_encode`` (traceable) in ``encode``
    (slicing over the batch, a distribution object no program returns). A wrapper runs
    as Python on the compiled module, so that its ``self._encode`` is the program;
    left to the model it would call the model's own ``_encode``, op by op (Wan-Animate-2's
    five encodes: 36 of a 108 s run, measured)."""
    return [m[1:] for m in methods if m.startswith("_") and m[1:] not in methods
            and callable(getattr(type(module), m[1:], None))]


class Buffers(dict):
    """A JittableModule's buffers by name (what its programs take) that can also be
    called as ``nn.Module.buffers()``. A pytree node as a dict is, for PyTorch and JAX
    (which both take a dict's subclass for a leaf), for torchax's own jitted calls."""

    def __call__(self, recurse: bool = True):
        return iter(self.values())


def _flatten(buffers: Buffers):
    return list(buffers.values()), list(buffers)


def _unflatten(values, keys) -> Buffers:
    return Buffers(zip(keys, values))


@functools.cache
def _register_buffers() -> None:
    import jax
    import torch.utils._pytree as pytree

    pytree.register_pytree_node(Buffers, _flatten, _unflatten,
                                serialized_type_name="porter.Buffers")
    jax.tree_util.register_pytree_node(Buffers, _flatten,
                                       lambda keys, values: _unflatten(values, keys))


def _signed(call, original):
    """``call`` with ``original``'s signature (``inspect.signature`` follows
    ``__wrapped__``)."""
    @functools.wraps(original)
    def signed(*args, **kwargs):
        return call(*args, **kwargs)

    return signed


def _whole(compiled, method, split, lists: list[str], label: str | None = None):
    """One compiled method of a JittableModule (a method's name, or a function taking
    the module first, called ``label``): jitted per set of static arguments
    (trace-cached where the split has a trace cache); eager, with its submodules
    compiled, once it proves untraceable. With ``lists`` (scanned block lists), a
    failure to trace is the recipe's to settle: the blocks' weights are stacked."""
    function = getattr(type(compiled._model), method) if isinstance(method, str) else method
    label = label or method
    program = autosplit.programs(functools.partial(compiled.functional_call, method),
                                 f"{split.component}.{label}", split)

    # the buffers as a plain dict: the trace cache serialises the program's arguments'
    # tree, which a registered node would not pass
    def traced(static, *args, **kwargs):
        return program(static)(compiled.params, dict(compiled.buffers), *args, **kwargs)

    def eager(*args, **kwargs):
        return compiled.functional_call(method, compiled.params, dict(compiled.buffers),
                                        *args, **kwargs)

    if lists:
        from porter.transforms.jit import scan  # lazy: as in _jit

        return scan.refusing(traced, split.component, signature_of=function)
    # a component's forward is the component itself in the split (and its messages)
    key = "" if label == "forward" else f"{label}()"
    return autosplit.splitting_call(compiled._model, "", split, signature_of=function,
                                    traced=traced, eager=eager, key=key)


def problems(recipe: Recipe, family: ModelFamily, modules: dict) -> list:
    """Components, methods and submodules the recipe names must exist (``modules``:
    the components' sketches)."""
    import re

    found = []
    for name, rule in recipe.compile.items():
        if name not in modules:
            found.append(recipe.problem(f"compile.{name}", f"no component {name!r}",
                                        hint=f"components: {', '.join(sorted(modules))}"))
            continue
        if rule.modules is not None:
            try:
                matched = any(re.fullmatch(rule.modules, n) for n in modules[name].submodules)
            except re.error as exc:
                found.append(recipe.problem(f"compile.{name}.modules", f"invalid regex: {exc}"))
                continue
            if not matched:
                found.append(recipe.problem(f"compile.{name}.modules",
                                            f"{name}: {rule.modules!r} matches no submodule",
                                            hint="`porter inspect` lists module names"))
            continue
        for method in rule.methods:
            if not modules[name].has_method(method):
                found.append(recipe.problem(f"compile.{name}.methods",
                                            f"{name} has no method {method!r}"))
    return found


# ------------------------------------------------------------------------- the pass

def sharded_inputs(b: Building, name: str) -> dict:
    """The component's keyword inputs placed on the mesh (``sharding.input_specs``: a
    transformer's, by its family's default and the recipe's ``sharding.inputs``)."""
    return sharding.input_specs(b.recipe, name, b.runtime.axes, b.family, b.modules[name])


def _on_one_device(b: Building, name: str, piecewise: list, inputs: dict) -> bool:
    """Does a compiled component run on one device of the mesh: nothing shards it (no
    weight rule, no activation rule, no input sharding: ``inputs``, its
    ``sharded_inputs``), it is compiled whole, and the mesh has more than one device?"""
    return (name in b.placement.unsharded and b.runtime.mesh.devices.size > 1
            and b.compile.rules[name].modules is None and name not in piecewise
            and not inputs)


def _apply(b: Building) -> None:
    """Wrap each compiled component: its programs are traced and compiled on first use."""
    b.compile = Jitted(rules(b.recipe, b.family, b.runtime.platform),
                       traces=traces_mod.for_port(b.recipe, b.registry, b.family,
                                                    b.runtime))
    piecewise = in_pieces(b.recipe, b.modules)
    for name, rule in b.compile.rules.items():
        if name not in b.modules:
            continue
        if name in piecewise:
            component = pieces(b.modules[name], rule, b.compile.traces, name,
                               b.runtime.xla_options, b.compile.splits)
        else:
            component = apply(b.modules[name], rule, b.compile.traces, name,
                              b.runtime.xla_options, b.compile.splits,
                              b.family.compiled_functions.get(name))
        specs = sharded_inputs(b, name)
        if specs:
            component = sharding.ShardedInputs(component, specs, b.runtime,
                                               b.family.compiled_functions.get(name, ()))
        elif _on_one_device(b, name, piecewise, specs):
            placement.on_one_device(component, b.runtime)
            b.compile.one_device.add(name)
        setattr(b.pipe, name, component)


def _abstract(b: Building) -> None:
    b.compile = Jitted(rules(b.recipe, b.family, b.runtime.platform))
    piecewise = in_pieces(b.recipe, b.modules)
    for name, rule in b.compile.rules.items():
        if name not in b.modules:
            continue
        if _on_one_device(b, name, piecewise, sharded_inputs(b, name)):
            b.compile.one_device.add(name)
        no_cache(b.modules[name])  # traced as a run traces it
        if rule.scan and rule.modules is None and name not in piecewise:
            from porter.transforms.jit import scan  # lazy: as in _jit

            b.compile.scanned[name] = scan.identical_lists(b.modules[name])


def _around(c: Calling):
    """Porter's own lowerings of PyTorch operations in torchax's op table, around each
    call (before the attention pass's backend, which falls back to them)."""
    # lazy: its tables are of torch's ops, built at import; a check needs none of them
    from porter.shims import lowerings

    return lowerings.installed(c.runtime.env) if c.scope == CALL else None


def _fit(c: Checking) -> list[Problem]:
    return problems(c.recipe, c.family, c.modules)


def _detail(c: Checking) -> str | None:
    parts = []
    for name, rule in rules(c.recipe, c.family, None).items():
        if name in c.modules:
            methods = [m for m in rule.methods if c.modules[name].has_method(m)]
            parts.append(f"{name}.{'/'.join(methods)}"
                         + (f" (submodules {rule.modules})" if rule.modules else ""))
    return ", ".join(parts) or None


PASS = Pass(
    "compile", ("compile",), "compile the components' methods with jax.jit through "
    "torchax (whole, as a scan over identical blocks, or in pieces for a step cache)",
    each_call="Porter's own lowerings of PyTorch operations in torchax's op table",
    fit=_fit, apply=_apply, abstract=_abstract, detail=_detail, around=_around)
