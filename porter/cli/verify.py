"""porter verify: the port against PyTorch, module by module."""

from __future__ import annotations

import json

from porter.cli import common

HELP = "compare the port with PyTorch, module by module"


def add(commands) -> None:
    parser = commands.add_parser(
        "verify", help=HELP,
        description="Run the recipe's transformer as ported (dtypes, sharding, patches, "
        "attention) and in PyTorch (float32, CPU, eager) on identical random inputs; print "
        "the max absolute and relative error of every module matching verify.modules, the "
        "first one over verify.tolerance, and the final output's error. Exit code 3 when "
        "over tolerance.")
    common.recipe_args(parser, json=True, example="verify.tolerance=1e-4")
    parser.add_argument("--sharded", action="store_true",
                        help="compare the sharded port with the same port on one device")


def handle(args) -> int:
    # lazy: only the subcommand asked for is imported
    from porter import registry as registry_mod
    from porter.commands import verify  # lazy: only the subcommand asked for is imported

    loaded = common.load_recipe(args)
    result = verify.verify(loaded, registry_mod.loaded(), sharded=args.sharded)
    print(json.dumps(result, indent=2) if args.json else verify.render(result))
    return 0 if result["ok"] else 3
