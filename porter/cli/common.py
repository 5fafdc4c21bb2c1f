"""What several subcommands' parsers and handlers share: the recipe and its overrides,
--devices and --target, loading the recipe before JAX starts, status lines."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from porter import recipe, runtime
from porter.aot import targets
from porter.errors import UsageError
from porter.runtime import distributed


def recipe_args(parser: argparse.ArgumentParser, json: bool = False,
                example: str = "generate.steps=4", cpu_devices: bool = True) -> None:
    """The recipe and its overrides (``example``: one, for the help), and
    ``--cpu-devices`` where the command starts JAX's devices (``cpu_devices``)."""
    parser.add_argument("recipe", help="path to a recipe YAML file")
    parser.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE",
                        help=f"override recipe keys, type-checked (e.g. {example})")
    if cpu_devices:
        parser.add_argument("--cpu-devices", type=int, metavar="N",
                            help="N virtual CPU devices instead of the machine's own (same "
                                 "as runtime.cpu_devices=N)")
    if json:
        parser.add_argument("--json", action="store_true", help="print the result as JSON")


def process_args(parser: argparse.ArgumentParser, title: str, text: str) -> None:
    """--coordinator, --num-processes, --process-id, --multi-process: one process of a
    run spread over several (hosts), on JAX's multi-controller runtime."""
    group = parser.add_argument_group(title, text + " Defaults come from "
                                      "JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and "
                                      "JAX_PROCESS_ID.")
    group.add_argument("--coordinator", metavar="HOST:PORT",
                       help="address of process 0, which every process connects to")
    group.add_argument("--num-processes", type=int, metavar="N", help="processes in all")
    group.add_argument("--process-id", type=int, metavar="I", help="this process, 0..N-1")
    group.add_argument("--multi-process", action="store_true",
                       help="let JAX detect the processes (TPU pods, SLURM, Open MPI)")


def request_processes(args) -> None:
    """``process_args``'s values, where the run will join the other processes."""
    distributed.request(args.coordinator, args.num_processes, args.process_id,
                        auto=args.multi_process)


def devices_arg(parser: argparse.ArgumentParser, text: str) -> None:
    """--devices N: as if there were N devices (plan, validate); --cpu-devices N makes
    N virtual CPU devices for real (run, verify, bench)."""
    parser.add_argument("--devices", type=positive, metavar="N", help=text)


def target_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", metavar="TPU",
                        help="as --devices, for the chips of a TPU slice and its platform "
                             "(v6e-8, v5e-8, v5p-8, v4-8, ...; `porter compile --help` "
                             "lists them)")


def devices_for(args) -> tuple[int | None, object]:
    """(devices, target) from --devices / --target."""
    if not getattr(args, "target", None):
        return args.devices, None
    target = targets.named(args.target)
    if args.devices is not None and args.devices != target.chips:
        raise UsageError(f"--devices {args.devices} and --target {target.name} "
                         f"({target.chips} chips) disagree", hint="give one of them")
    return target.chips, target


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def tcp_port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 0 to 65535, got {value}")
    return value


def load_recipe(args):
    """The recipe with its overrides (and --cpu-devices), JAX's platform and device count
    set as it asks: JAX reads them once, when first imported."""
    overrides = list(args.overrides)
    order_problems(args.command, args.recipe, overrides)
    if getattr(args, "cpu_devices", None) is not None:
        overrides.append(f"runtime.cpu_devices={args.cpu_devices}")
    loaded = recipe.load(args.recipe, overrides)
    runtime.configure(loaded.runtime.platform, loaded.runtime.cpu_devices)
    return resolved(loaded)


def order_problems(command: str, recipe_arg: str, overrides: list[str]) -> None:
    """An override where the recipe belongs, or a second recipe where overrides go:
    said as that, not as a missing file or a malformed override."""
    if "=" in recipe_arg and not recipe.exists(Path(recipe_arg)):
        raise UsageError(f"{recipe_arg}: an override where the recipe file belongs",
                         hint=f"the recipe comes first: porter {command} RECIPE.yaml "
                         f"{shlex.quote(recipe_arg)}")
    second = next((o for o in overrides if "=" not in o
                   and o.endswith((".yaml", ".yml"))), None)
    if second is not None:
        raise UsageError(f"porter {command} takes one recipe: {second} is a second",
                         hint="a recipe can build on another with extends: base.yaml")


def resolved(loaded):
    """The recipe with an original release's folder as model.source read as a
    diffusers layout (``porter.loading.release``)."""
    # lazy: the registry loads every plugin
    from porter import registry as registry_mod
    from porter.loading import release  # lazy: diffusers and torch come with it

    return release.resolved(loaded, registry_mod.loaded())
