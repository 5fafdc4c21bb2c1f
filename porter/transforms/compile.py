"""Compile pipeline components with jax.jit through torchax, as the recipe says."""

from __future__ import annotations

from porter.schema import CompileRule


def rules(recipe, family) -> dict[str, CompileRule]:
    """Component -> how to compile it: the family's defaults, then the recipe's."""
    plan = {name: CompileRule(methods=list(methods))
            for name, methods in family.compiled.items()}
    plan.update(recipe.compile)
    return {name: rule for name, rule in plan.items() if rule.methods}


def apply(module, rule: CompileRule):
    """A module whose ``rule.methods`` are jitted once per input shape and reused."""
    from porter.compat import import_torchax

    torchax = import_torchax()
    jit_kwargs = {"static_argnames": tuple(rule.static_argnames)}
    if rule.donate_argnames:
        jit_kwargs["donate_argnames"] = tuple(rule.donate_argnames)
    options = torchax.CompileOptions(methods_to_compile=list(rule.methods),
                                     jax_jit_kwargs=jit_kwargs)
    return torchax.compile(module, options)


def problems(recipe, family, modules: dict) -> list:
    """Components and methods the recipe names must exist (checked on meta models)."""
    found = []
    for name, rule in recipe.compile.items():
        if name not in modules:
            found.append(recipe.problem(f"compile.{name}", f"no component {name!r}",
                                        hint=f"components: {', '.join(sorted(modules))}"))
            continue
        for method in rule.methods:
            if not callable(getattr(modules[name], method, None)):
                found.append(recipe.problem(f"compile.{name}.methods",
                                            f"{name} has no method {method!r}"))
    return found
