"""Every check that needs no weights: what `porter validate` runs."""

from __future__ import annotations

import difflib

from porter import loading, patches
from porter.transforms import attention, dtypes, sharding
from porter.errors import Problem, UsageError


def family_problems(recipe, registry) -> list[Problem]:
    name = recipe.model.family
    if name in registry.families:
        return []
    close = difflib.get_close_matches(name, list(registry.families), n=1)
    known = ", ".join(sorted(registry.families)) or "none"
    hint = f"did you mean {close[0]!r}?" if close else f"registered families: {known}"
    return [recipe.problem("model.family", f"unknown model family {name!r}", hint=hint)]


def recipe_problems(recipe, registry) -> list[Problem]:
    """Schema-level problems that need the plugins but not JAX or weights."""
    problems = family_problems(recipe, registry)
    if not problems:
        family = registry.family(recipe.model.family)
        problems += family.check(recipe)
        if recipe.rotary.precompute and family.rotary_patch_for(recipe) is None:
            problems.append(recipe.problem("rotary.precompute", f"family {family.name!r} "
                                           "has no rotary cache", hint="set it to false"))
    problems += patches.problems(recipe, registry)
    problems += attention.problems(recipe, registry)
    problems += loading.source_problems(recipe)
    problems += sharding.rule_problems(recipe) + dtypes.rule_problems(recipe)
    return problems


def mesh_problems(recipe) -> list[Problem]:
    """Does the mesh fit the devices JAX sees? (imports JAX)"""
    from porter import runtime

    runtime.configure(recipe.runtime.platform, recipe.runtime.cpu_devices)
    import jax

    try:
        runtime.resolve_mesh(recipe.mesh, jax.device_count())
    except UsageError as exc:
        return [recipe.problem("mesh", exc.message, hint=exc.hint)]
    from porter import plugins
    return attention.platform_problems(recipe, plugins.registry(), jax.default_backend())


def shape_problems(recipe, registry) -> list[Problem]:
    """Sharding rules against the model's shapes (meta device, no weights)."""
    from porter import plan

    if not (recipe.sharding.weights or recipe.sharding.inputs or recipe.dtypes.overrides
            or recipe.dtypes.components or recipe.sharding.activations or recipe.compile):
        return []
    try:
        built = plan.build(recipe, registry)
    except UsageError:
        return []  # no configuration to check against (e.g. a hub id, offline)
    return built["problems"]


def validate(recipe, registry) -> list[Problem]:
    problems = recipe_problems(recipe, registry)
    if problems:
        return problems  # shape checks need a sound recipe
    problems = mesh_problems(recipe)
    return problems or shape_problems(recipe, registry)


def checked_family(recipe, registry):
    """Set up JAX's platform and devices (before JAX starts), run the checks that need
    no weights, and return the recipe's family; RecipeError lists every problem."""
    from porter import runtime
    from porter.errors import RecipeError

    runtime.configure(recipe.runtime.platform, recipe.runtime.cpu_devices)
    problems = recipe_problems(recipe, registry)
    if problems:
        raise RecipeError(problems)
    return registry.family(recipe.model.family)
