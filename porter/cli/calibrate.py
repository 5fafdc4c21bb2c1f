"""porter calibrate: MagCache's magnitude ratios for the recipe's model."""

from __future__ import annotations

import os.path

from porter.cli import common
from porter.runtime import distributed

HELP = "measure MagCache's magnitude ratios for the recipe's model"


def add(commands) -> None:
    parser = commands.add_parser(
        "calibrate", help=HELP,
        description="Run the recipe's encode and denoise stages once, skipping nothing, "
        "and write MagCache's magnitude ratios (each transformer's, per guidance branch) "
        "to a JSON file that the recipe's cache section names: cache: {method: magcache, "
        "mag_ratios: FILE}. The ratios serve any step count (resampled to it): calibrate "
        "once, at the step count you run most. See docs/caching.md.")
    common.recipe_args(parser)
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="where to write the ratios (default: "
                             "<output.dir>/mag_ratios.json)")
    parser.add_argument("--no-progress", action="store_true",
                        help="hide the progress bar and the status lines (warnings and "
                             "errors still show)")


def handle(args) -> int:
    from porter.commands.calibrate import calibrate  # lazy: only the subcommand asked for

    loaded = common.load_recipe(args)
    path, summary = calibrate(loaded, args.output, progress=not args.no_progress)
    if not distributed.writes():
        return 0
    counts = ", ".join(f"{name}: {len(next(iter(contexts.values())))} steps"
                       for name, contexts in summary["ratios"].items())
    folder = loaded.path.parent if loaded.path else None
    named = os.path.relpath(path.absolute(), folder) if folder else str(path)
    if named.startswith(".."):  # outside the recipe's folder: the full path reads better
        named = str(path.absolute())
    print(f"wrote {path} ({counts})")
    print(f"use it: cache: {{method: magcache, mag_ratios: {named}}}")
    return 0
