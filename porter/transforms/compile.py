"""Compile pipeline components with jax.jit through torchax, as the recipe says."""

from __future__ import annotations

from porter.schema import CompileRule


def rules(recipe, family) -> dict[str, CompileRule]:
    """Component -> how to compile it: the family's defaults, then the recipe's."""
    plan = {name: CompileRule(methods=list(methods))
            for name, methods in family.compiled.items()}
    plan.update(recipe.compile)
    return {name: rule for name, rule in plan.items() if rule.methods}


def apply(module, rule: CompileRule, traces=None, name: str = "", xla_options=None):
    """A module whose ``rule.methods`` are jitted once per input shape and reused;
    with ``rule.modules``, the module itself stays eager and each matching submodule
    is jitted instead. ``traces`` (a TraceCache) keeps the traced programs on disk;
    ``xla_options`` are XLA's compiler options for every program."""
    output_classes_as_pytrees()
    jit_kwargs = {"static_argnames": tuple(rule.static_argnames)}
    if rule.donate_argnames:
        jit_kwargs["donate_argnames"] = tuple(rule.donate_argnames)
    if xla_options:
        jit_kwargs["compiler_options"] = dict(xla_options)
    if rule.modules is not None:
        return _compile_submodules(module, rule, traces, name, jit_kwargs)
    return _jit(module, rule, traces, name, jit_kwargs)


_REGISTERED: set = set()


def output_classes_as_pytrees() -> None:
    """Let a compiled method return diffusers' and transformers' output classes
    (``DecoderOutput``, ``Transformer2DModelOutput``, ...: what a pipeline gets when
    it calls ``vae.decode(x)`` without ``return_dict=False``). Both libraries register
    them as PyTorch pytrees; JAX, which sees a jitted function's outputs, needs them
    too. Classes defined so far are registered, each once."""
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


def _compile_submodules(module, rule: CompileRule, traces, name: str, jit_kwargs: dict):
    import re

    targets = [name for name, _ in module.named_modules()
               if name and re.fullmatch(rule.modules, name)]
    for target in targets:
        parent_name, _, child = target.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        parent._modules[child] = _jit(parent._modules[child], rule, traces,
                                      f"{name}.{target}", jit_kwargs)
    return module


def _jit(module, rule: CompileRule, traces, name: str, jit_kwargs: dict):
    from porter.compat import import_torchax

    torchax = import_torchax()
    options = torchax.CompileOptions(methods_to_compile=list(rule.methods),
                                     jax_jit_kwargs=jit_kwargs)
    compiled = torchax.compile(module, options)
    if traces is not None:
        for method in rule.methods:
            _trace_cached(compiled, method, traces, f"{name}.{method}", jit_kwargs)
    return compiled


def _trace_cached(compiled, method: str, traces, name: str, jit_kwargs: dict) -> None:
    """Replace torchax's jitted ``method`` with one backed by the trace cache (the
    same call: parameters and buffers first, then the method's arguments)."""
    import functools

    from porter.compat import import_torchax

    interop = import_torchax().interop
    jitted = interop.wrap_jax_jit(
        functools.partial(compiled.functional_call, method),
        jax_jit_func=functools.partial(traces.jit, name), kwargs_for_jax=jit_kwargs)

    def call(*args, **kwargs):
        return jitted(compiled.params, compiled.buffers, *args, **kwargs)

    compiled._jitted[method] = call


def problems(recipe, family, modules: dict) -> list:
    """Components, methods and submodules the recipe names must exist (meta models)."""
    import re

    found = []
    for name, rule in recipe.compile.items():
        if name not in modules:
            found.append(recipe.problem(f"compile.{name}", f"no component {name!r}",
                                        hint=f"components: {', '.join(sorted(modules))}"))
            continue
        if rule.modules is not None:
            try:
                matched = any(re.fullmatch(rule.modules, n) for n, _ in
                              modules[name].named_modules() if n)
            except re.error as exc:
                found.append(recipe.problem(f"compile.{name}.modules", f"invalid regex: {exc}"))
                continue
            if not matched:
                found.append(recipe.problem(f"compile.{name}.modules",
                                            f"{name}: {rule.modules!r} matches no submodule",
                                            hint="`porter inspect` lists module names"))
            continue
        for method in rule.methods:
            if not callable(getattr(modules[name], method, None)):
                found.append(recipe.problem(f"compile.{name}.methods",
                                            f"{name} has no method {method!r}"))
    return found
