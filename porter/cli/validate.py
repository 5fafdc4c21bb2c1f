"""porter validate: every check that needs no weights."""

from __future__ import annotations

import sys

from porter.cli import common
from porter.errors import RecipeError
from porter.runtime import mesh_text, resolve_mesh

HELP = "check a recipe without loading weights"


def add(commands) -> None:
    parser = commands.add_parser(
        "validate", help=HELP,
        description="Schema, plugin, source, mesh and sharding checks; prints every "
        "problem found (the recipe's form first: a value of the wrong type holds back the "
        "checks that read it until it is fixed). The mesh and the sharding rules are "
        "checked against the devices JAX "
        "sees, or with --devices N against N devices that need not exist here (check a "
        "TPU recipe on a laptop).")
    common.recipe_args(parser)
    common.devices_arg(parser, "check the mesh and sharding rules for N devices (none "
                       "need exist here; default: the devices JAX sees)")
    common.target_arg(parser)


def handle(args) -> int:
    # lazy: only the subcommand asked for is imported
    from porter import registry as registry_mod
    from porter.commands.validate import validate  # lazy: only the subcommand asked for

    loaded = common.load_recipe(args)
    devices, target = common.devices_for(args)
    skipped: list[str] = []
    problems = validate(loaded, registry_mod.loaded(), devices, target, skipped)
    if problems:
        print(RecipeError(problems).render(), file=sys.stderr)
        return 2
    where = f" on {target.name} ({devices} chips)" if target else \
        f" on {devices} devices" if devices else ""
    # for a machine named (--devices, --target), the mesh as it will be (an auto axis
    # filled); else as written (the devices here are JAX's to count: not imported)
    mesh = resolve_mesh(loaded.mesh, devices) if devices else loaded.mesh
    print(f"{args.recipe}: ok ({loaded.model.family}, mesh {mesh_text(mesh)}{where})"
          + "".join(f"; {what}" for what in skipped))
    return 0
