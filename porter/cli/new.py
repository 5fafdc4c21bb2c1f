"""porter new: a commented starter recipe."""

from __future__ import annotations

from porter.errors import RecipeError, UsageError

HELP = "write a starter recipe"


def add(commands) -> None:
    parser = commands.add_parser(
        "new", help=HELP,
        description="Write a commented starter recipe with every section, from a family's "
        "defaults or extending an existing recipe.")
    parser.add_argument("name", help="recipe name (written to recipes/NAME.yaml) or a path")
    parser.add_argument("--family", help="model family (`porter plugins`); with --from, "
                        "the existing recipe's (a different one is refused)")
    parser.add_argument("--from", dest="base", metavar="EXISTING",
                        help="an existing recipe to extend")
    parser.add_argument("--force", action="store_true", help="overwrite an existing file")


def handle(args) -> int:
    # lazy: only the subcommand asked for is imported
    from porter import registry as registry_mod
    from porter.commands import new  # lazy: only the subcommand asked for is imported

    based = _family_of(new, args.base, given=args.family) if args.base else None
    if args.family and based and args.family != based:  # the base's family is what runs
        raise UsageError(f"--family {args.family} differs from {based}, the family of "
                         f"{args.base}: a recipe extending it runs as {based}",
                         hint="drop --family to extend it, or drop --from to start a "
                         f"{args.family} recipe of its own")
    family = args.family or based
    if family is None:
        raise UsageError("porter new needs --family (or --from an existing recipe)",
                         hint="`porter plugins` lists the families, e.g. --family wan")
    path = new.write(args.name, registry_mod.loaded().family(family), args.base,
                     force=args.force)
    print(f"wrote {path}; next: porter validate {path}")
    return 0


def _family_of(new, base: str, given: str | None) -> str | None:
    """The family the recipe ``base`` runs as. A base that does not validate alone (a
    partial one, without generate: say) is refused as any recipe is, unless --family
    ``given`` says the family: then None (the recipe extending it completes it)."""
    try:
        return new.base_family(base)
    except RecipeError:
        if given:
            return None
        raise
