"""``setup``: diffusers' own set-up methods, called on a component after loading.

Some models only run at a useful size with a component set up the way diffusers
documents it (a VAE that decodes tile by tile or one video at a time). A recipe
names such calls per component; only the methods in ``ALLOWED`` can be named:
each changes how a component computes, never which weights it holds, so the
sharding rules, the plan and the trace keys stay valid.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from porter.transforms import Checking, Pass

if TYPE_CHECKING:
    from porter.errors import Problem
    from porter.recipe import Recipe
    from porter.transforms.building import Building

#: set-up methods a recipe may call: memory/compute trade-offs diffusers offers
ALLOWED = ("enable_tiling", "disable_tiling", "enable_slicing", "disable_slicing",
           "enable_framewise_decoding", "enable_framewise_encoding",
           "enable_forward_chunking", "disable_forward_chunking")


def calls(recipe: Recipe) -> list[tuple[str, int, str, dict]]:
    """(component, index, method, params) for every call the recipe names."""
    found = []
    for component, entries in recipe.setup.items():
        for index, entry in enumerate(entries):
            name, params = (entry, {}) if isinstance(entry, str) else \
                (entry.name, dict(entry.params))
            found.append((component, index, name, params))
    return found


def problems(recipe: Recipe, modules: dict) -> list:
    """Unknown components, methods outside ``ALLOWED`` or missing from the component's
    class, and parameters the method does not take (``modules``: the components'
    sketches)."""
    import difflib

    found = []
    for component, index, name, params in calls(recipe):
        path = f"setup.{component}.{index}"
        if component not in modules:
            found.append(recipe.problem(f"setup.{component}", f"no component {component!r}",
                                        hint=f"components: {', '.join(sorted(modules))}"))
            continue
        if name not in ALLOWED:
            close = difflib.get_close_matches(name, ALLOWED, n=1)
            found.append(recipe.problem(path, f"{name!r} is not a set-up method Porter calls",
                                        hint=(f"did you mean {close[0]!r}? " if close else "")
                                        + f"allowed: {', '.join(ALLOWED)}"))
            continue
        sketch = modules[component]
        if not sketch.has_method(name):
            offered = [m for m in ALLOWED if sketch.has_method(m)]
            found.append(recipe.problem(path, f"{component} ({sketch.class_name})"
                                        f" has no method {name!r}",
                                        hint=f"it has: {', '.join(offered) or 'none of them'}"))
            continue
        signature = sketch.signature(name)
        try:
            if signature is not None:
                signature.bind(**params)
        except TypeError as exc:
            taken = ", ".join(signature.parameters) or "none"
            found.append(recipe.problem(f"{path}.params", f"{name}: {exc}",
                                        hint=f"it takes: {taken}"))
    return found


def apply(pipe, recipe: Recipe) -> list[str]:
    """Call the recipe's set-up methods on the loaded pipeline's components; returns
    what was called, for the run record."""
    done = []
    for component, _, name, params in calls(recipe):
        getattr(getattr(pipe, component), name)(**params)
        done.append(f"{component}.{name}")
    return done


def _fit(c: Checking) -> list[Problem]:
    return problems(c.recipe, c.modules)


def _apply(b: Building) -> None:
    done = apply(b.pipe, b.recipe)
    if done:
        b.say(f"set up: {', '.join(done)}")


def _detail(c: Checking) -> str | None:
    return ", ".join(f"{component}.{name}" for component, _, name, _ in calls(c.recipe)) \
        or None


PASS = Pass(
    "setup", ("setup",), "call the set-up methods the recipe names (VAE tiling, ...)",
    fit=_fit, apply=_apply, abstract=_apply, detail=_detail)
