"""porter inspect: tensor name patterns, shapes and the rules that match them."""

from __future__ import annotations

import json

from porter.cli import common

HELP = "tensor name patterns, shapes and matching rules, without weights"


def add(commands) -> None:
    parser = commands.add_parser(
        "inspect", help=HELP,
        description="Each component's tensors grouped into name patterns (block numbers as "
        "*) with shapes, dtypes and counts, and which sharding and dtype rule matches each.")
    common.recipe_args(parser, json=True, example="model.dtype=bfloat16")


def handle(args) -> int:
    # lazy: only the subcommand asked for is imported
    from porter import registry as registry_mod
    from porter.commands import inspect  # lazy: only the subcommand asked for is imported

    loaded = common.load_recipe(args)
    result = inspect.inspect(loaded, registry_mod.loaded())
    print(json.dumps(result, indent=2) if args.json else inspect.render(result))
    return 0
