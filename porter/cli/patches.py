"""porter patches: the registered patches, where they apply and whether they fit."""

from __future__ import annotations

import textwrap

from porter.transforms.patches import PatchError

HELP = "list registered patches with their docs"


def add(commands) -> None:
    commands.add_parser("patches", help=HELP,
                        description="Each patch: its target, the versions it is known to "
                        "fit, whether the target exists in what is installed, and its doc.")


def handle(args) -> int:
    # lazy: only the subcommand asked for is imported
    from porter import registry as registry_mod

    registry = registry_mod.loaded()
    for name in sorted(registry.patches):
        patch = registry.patches[name]
        try:
            patch.check_target()
            state = "target found"
        except PatchError:
            state = "TARGET MISSING in the installed version"
        library, found, fits = patch.installed_fits()
        if fits is not None:
            state += f"; {library} {found} " + ("fits" if fits else "IS OUTSIDE what it fits")
        params = ", ".join(f"{k}={v!r}" for k, v in patch.params.items())
        print(f"{name}  (from {registry.owners[('patch', name)]}; {state})")
        print(f"    target: {patch.target}   fits: {patch.fits or '?'}"
              + (f"   params: {params}" if params else ""))
        print(textwrap.fill(patch.doc, width=88, initial_indent="    ",
                            subsequent_indent="    "))
    return 0
