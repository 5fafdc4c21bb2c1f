"""porter plugins: the installed plugins and what each registered."""

from __future__ import annotations

HELP = "list loaded plugins and what they registered"


def add(commands) -> None:
    commands.add_parser("plugins", help=HELP,
                        description="The plugins Porter loaded (its own families' and any "
                        "installed under the 'porter' entry point group) and, for each, the "
                        "families, patches and attention backends it registered.")


def handle(args) -> int:
    # lazy: only the subcommand asked for is imported
    from porter import registry as registry_mod

    registry = registry_mod.loaded()
    for name in registry.plugins:
        items = registry.registered_by(name)
        print(f"{name}: " + (", ".join(items) if items else "registers nothing yet"))
        for item in items:
            kind, _, family = item.partition(" ")
            if kind == "family":
                print(f"    {registry.families[family].summary}")
    return 0
