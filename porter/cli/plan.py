"""porter plan: where each weight goes and the bytes per device, without weights."""

from __future__ import annotations

import json

from porter.cli import common

HELP = "where each weight goes and bytes per device, without weights"


def add(commands) -> None:
    parser = commands.add_parser(
        "plan", help=HELP,
        description="For each component: which sharding rule matched how many tensors and "
        "bytes, bytes per device (sharded and replicated), and the total per device. "
        "Needs no weights, and no devices of the mesh's size: --devices N plans for N "
        "(the default is the devices JAX sees here, one on a plain CPU machine).")
    common.recipe_args(parser, json=True, example="mesh.tp=8")
    common.devices_arg(parser, "plan for N devices (none need exist here; default: the "
                       "devices JAX sees)")
    common.target_arg(parser)


def handle(args) -> int:
    # lazy: only the subcommand asked for is imported
    from porter import registry as registry_mod
    from porter.commands import plan  # lazy: only the subcommand asked for is imported

    loaded = common.load_recipe(args)
    devices, target = common.devices_for(args)
    built = plan.plan(loaded, registry_mod.loaded(), devices, target)
    print(json.dumps(plan.to_json(built), indent=2) if args.json else plan.render(built))
    return 2 if built["problems"] else 0
