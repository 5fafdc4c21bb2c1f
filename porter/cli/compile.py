"""porter compile: every program of a run compiled for a TPU, without a TPU or weights."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from porter.aot.targets import TARGETS
from porter.cli import child, common
from porter.errors import UsageError
from porter.runtime import notices

HELP = "compile every program of a run for a TPU, without a TPU or weights"


def add(commands) -> None:
    parser = commands.add_parser(
        "compile", help=HELP,
        description="Build the recipe's port for a TPU slice with every weight and input "
        "abstract (shapes and shardings, no values) and have the TPU's own compiler "
        "(libtpu, no TPU needed) compile each program a run compiles: text encoder, "
        "transformer(s) with the guidance passes as the run batches them, VAE. Prints per "
        "program and per chip the memory XLA's TPU memory analysis gives (weights of every "
        "component stay resident) against the chip's HBM, FLOPs, bytes accessed, "
        "collectives and compile time, and a lower bound on a denoising step's time. Exit "
        "code 2 when a program does not fit (or cannot be compiled), naming it and what "
        "to change. Needs libtpu: pip install -e '.[tpu]' in Porter's checkout.",
        epilog="targets: " + ", ".join(TARGETS) + "  (v4/v5p: the number counts "
        "TensorCores, two per chip; v5e/v6e: chips)")
    common.recipe_args(parser, example="mesh.tp=8", cpu_devices=False)
    parser.add_argument("--target", required=True, metavar="TPU",
                        help="the slice to compile for, as Cloud TPU names it (v6e-8, "
                             "v5e-8 or v5litepod-8, v5p-8, v4-8, v6e-16, v7x-8, ...)")
    parser.add_argument("--program", action="append", metavar="NAME",
                        help="compile only this program (e.g. transformer.forward, "
                             "vae.decode; Wan's streamed decode: vae.decode_chunk; a "
                             "wrong name is answered with the recipe's list; repeat for "
                             "more); every weight still counts")
    parser.add_argument("--choose-mesh", action="store_true",
                        help="compile the recipe with every mesh of the target's chips "
                             "(the guidance batch over dp; the rest over tp, sp, ring or "
                             "ring x sp) and name the one with the lowest step bound that "
                             "fits, with the overrides that run it; the recipe's weight "
                             "rules stay as written. Several minutes at real size: give "
                             "--program transformer.forward to compile only what a step "
                             "runs")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--hlo", metavar="DIR",
                        help="also write each compiled program's optimized HLO to DIR "
                             "(made if missing; the NN-*.hlo files of an earlier compile "
                             "there are replaced), one NN-component.method.hlo file a "
                             "program (NN its place in the run; a program of the same "
                             "shape as an earlier one has none): what the TPU compiler "
                             "made of it, with its own estimate of each instruction's "
                             "cycles (a checkout's benchmarks/hlo_cycles.py sums them by "
                             "kind of operation)")


def handle(args) -> int:
    if args.hlo and args.choose_mesh:
        raise UsageError("--hlo keeps the programs of one compile, not of every mesh "
                         "--choose-mesh tries",
                         hint="choose the mesh first, then compile with its overrides and "
                              "--hlo")
    common.order_problems(args.command, args.recipe, list(args.overrides))
    hlo_dir = _hlo_dir(args.hlo)  # before the child: a bad folder is said at once
    if child.wanted(args):  # libtpu compiles in a child: a crash there becomes a message
        return child.run(child.again(), what="porter compile", debug=args.debug)
    from porter import recipe  # lazy: only the subcommand asked for is imported
    from porter import registry as registry_mod  # lazy: as above
    from porter.commands import compile  # lazy: as above

    compile.host_compiles()  # JAX on the CPU; libtpu only describes the target
    if args.choose_mesh:
        return _choose_mesh(args)
    loaded = common.resolved(recipe.load(args.recipe, list(args.overrides)))
    built = compile.build(loaded, registry_mod.loaded(), args.target, only=args.program,
                          say=notices.status, hlo_dir=hlo_dir)
    print(json.dumps(built, indent=2) if args.json else compile.render(built))
    verdict = built["verdict"]
    if verdict["fits"]:
        return 0
    print(f"error: {verdict['message']}" + (f"\n  hint: {verdict['hint']}"
                                             if verdict["hint"] else ""), file=sys.stderr)
    return 2


def _hlo_dir(given: str | None) -> Path | None:
    """``--hlo``'s folder, checked before anything compiles (minutes would be lost to a
    folder that cannot be written); made when the programs to compile are known."""
    if given is None:
        return None
    from porter.runtime import atomic  # lazy: only a compile that keeps HLO needs it

    folder = Path(given).expanduser()
    problem = atomic.writable_problem(folder)
    if problem:
        raise UsageError(f"--hlo {given}: {problem}", hint="give a folder you can write")
    return folder


def _choose_mesh(args) -> int:
    from porter import recipe  # lazy: as handle's
    from porter import registry as registry_mod  # lazy: as handle's
    from porter.commands import compile  # lazy: as handle's

    def load(extra: list[str]):
        return common.resolved(recipe.load(args.recipe, list(args.overrides) + extra))

    choice = compile.choose_mesh(load, registry_mod.loaded(), args.target,
                                 only=args.program, say=notices.status)
    print(json.dumps(choice, indent=2) if args.json else compile.render_choice(choice))
    if choice["chosen"] is not None:
        return 0
    print("error: no mesh of the target's chips fits this recipe", file=sys.stderr)
    return 2
