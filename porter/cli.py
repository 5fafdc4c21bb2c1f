"""The ``porter`` command: parse, call the library, print. Nothing else lives here."""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from porter.runtime import interrupt
from porter.errors import Interrupted, PorterError, environment_problem, is_environment_error

EXAMPLES = """\
examples:
  porter run recipes/wan-tiny.yaml                  tiny random-weight Wan, writes a video
  porter run recipes/wan-tiny.yaml generate.steps=8 mesh.dp=2 --cpu-devices 2
  porter run recipes/wan-tiny.yaml --stage encode   then --stage denoise, --stage decode
  porter run recipes/wan-tiny.yaml --resume outputs/wan-tiny   continue where it stopped
  porter run recipes/wan-tiny.yaml --prompts prompts.txt   many videos, one load and compile
  porter serve recipes/wan-tiny.yaml --port 8000    an HTTP service (API at /docs)
  porter run R --coordinator host0:1234 --num-processes 2 --process-id 0   (and 1 elsewhere)
  porter validate recipes/wan-tiny.yaml             every check that needs no weights
  porter validate recipes/wan14b.yaml --devices 8   ... for an 8-chip machine, from here
  porter plan recipes/wan-tiny-tp.yaml --devices 8  bytes per device, from shapes alone
  porter compile recipes/wan14b.yaml --target v6e-8   will it fit? the TPU compiler says
  porter verify recipes/wan-tiny.yaml               port vs PyTorch, block by block
  porter calibrate recipes/wan-tiny.yaml            MagCache's ratios for a cache: section
  porter inspect recipes/wan1.3b.yaml               tensor patterns to write rules for
  porter new mymodel --family wan                   a commented starter recipe
  porter plugins                                    what each installed plugin registered
  porter patches                                    registered patches and their docs

exit codes: 0 success, 2 bad input (recipe, flags, sources, damaged files), a
refusing machine (disk full, read-only, no permission) or NaN in weights or
latents, 3 verify over tolerance, 1 internal failure (a Porter bug: report it),
130 interrupted (Ctrl-C), 143 killed (SIGTERM).
Add --debug to see tracebacks.
"""


def _recipe_args(parser: argparse.ArgumentParser, json: bool = False) -> None:
    parser.add_argument("recipe", help="path to a recipe YAML file")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="override recipe keys, type-checked (e.g. generate.steps=4)")
    parser.add_argument("--cpu-devices", type=int, metavar="N",
                        help="run on N virtual CPU devices (same as runtime.cpu_devices=N)")
    if json:
        parser.add_argument("--json", action="store_true", help="print the result as JSON")


def _devices_arg(parser: argparse.ArgumentParser, text: str) -> None:
    """--devices N: as if there were N devices (plan, validate); --cpu-devices N makes
    N virtual CPU devices for real (run, verify, bench)."""
    parser.add_argument("--devices", type=_positive, metavar="N", help=text)


def _target_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", metavar="TPU",
                        help="as --devices, for the chips of a TPU slice and its platform "
                             "(v6e-8, v5e-8, v5p-8, v4-8, ...; `porter compile --help` "
                             "lists them)")


def _devices_for(args) -> tuple[int | None, object]:
    """(devices, target) from --devices / --target."""
    from porter.aot import targets
    from porter.errors import UsageError

    if not getattr(args, "target", None):
        return args.devices, None
    target = targets.named(args.target)
    if args.devices is not None and args.devices != target.chips:
        raise UsageError(f"--devices {args.devices} and --target {target.name} "
                         f"({target.chips} chips) disagree", hint="give one of them")
    return target.chips, target


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="porter", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run diffusers video models on JAX through torchax, from YAML recipes.",
        epilog=EXAMPLES)
    parser.add_argument("--debug", action="store_true", help="show tracebacks and warnings")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = commands.add_parser("run", help="generate a video from a recipe",
                              description="Load the recipe's model, port it to JAX, "
                              "generate, and write video.mp4 and run.json to output.dir "
                              "(default outputs/<recipe name>). Each stage (encode, "
                              "denoise, decode) also leaves its output there, so a run "
                              "can be split (--stage) or continued (--resume).")
    _recipe_args(run)
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    run.add_argument("--stage", choices=("encode", "denoise", "decode"),
                     help="run one stage; its input comes from the run directory")
    run.add_argument("--resume", metavar="DIR",
                     help="continue the run in DIR after its last complete stage or "
                          "denoising checkpoint (with --prompts: the batch in DIR)")
    run.add_argument("--prompts", metavar="FILE",
                     help="a batch on one load and compile: one prompt a line, or JSON "
                          "Lines (.jsonl) of generate settings and an optional name; each "
                          "item goes to its own folder of output.dir, with batch.json")
    group = run.add_argument_group(
        "multi-process runs", "Start one `porter run` per process (per host), each with "
        "the same recipe and coordinator; the mesh spans every process's devices and "
        "process 0 writes the outputs. Defaults come from JAX_COORDINATOR_ADDRESS, "
        "JAX_NUM_PROCESSES and JAX_PROCESS_ID.")
    group.add_argument("--coordinator", metavar="HOST:PORT",
                       help="address of process 0, which every process connects to")
    group.add_argument("--num-processes", type=int, metavar="N", help="processes in all")
    group.add_argument("--process-id", type=int, metavar="I", help="this process, 0..N-1")
    group.add_argument("--multi-process", action="store_true",
                       help="let JAX detect the processes (TPU pods, SLURM, Open MPI)")

    serve = commands.add_parser(
        "serve", help="serve the recipe's model over HTTP (a JSON API of jobs)",
        description="Load and port the recipe's model once, then take jobs over HTTP: "
        "POST /jobs with any generate settings (JSON), GET /jobs/ID for status and step, "
        "GET /jobs/ID/video and /record for results, DELETE /jobs/ID to cancel a queued "
        "job; the API is described at /docs. Jobs run one at a time in submission order "
        "and live in output.dir/jobs. SIGTERM or Ctrl-C stops after the running job's "
        "next step with a checkpoint; started again on the same output.dir, the server "
        "serves what is done and continues the rest.")
    _recipe_args(serve)
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1: this machine only; "
                            "anything else needs a token)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    serve.add_argument("--token", help="bearer token every request must carry (default: "
                       "the PORTER_TOKEN environment variable)")
    serve.add_argument("--queue", type=_positive, default=16, metavar="N",
                       help="jobs that may wait (default 16; more are refused with 429)")
    serve.add_argument("--inputs", metavar="DIR",
                       help="folder whose image files jobs may name (\"image\": "
                            "\"frame.png\"; links may not lead out of it). Without it, "
                            "jobs send images as data URLs; the server opens no other path "
                            "a request names")

    validate = commands.add_parser(
        "validate", help="check a recipe without loading weights",
        description="Schema, plugin, source, mesh and sharding checks; prints every "
        "problem. The mesh and the sharding rules are checked against the devices JAX "
        "sees, or with --devices N against N devices that need not exist here (check a "
        "TPU recipe on a laptop).")
    _recipe_args(validate)
    _devices_arg(validate, "check the mesh and sharding rules for N devices (none need "
                 "exist here; default: the devices JAX sees)")
    _target_arg(validate)

    plan = commands.add_parser(
        "plan", help="where each weight goes and bytes per device, without weights",
        description="For each component: which sharding rule matched how many tensors and "
        "bytes, bytes per device (sharded and replicated), and the total per device. "
        "Needs no weights and no devices.")
    _recipe_args(plan, json=True)
    _devices_arg(plan, "plan for N devices (none need exist here; default: the devices "
                 "JAX sees)")
    _target_arg(plan)

    compile_ = commands.add_parser(
        "compile", help="compile every program of a run for a TPU, without a TPU or weights",
        description="Build the recipe's port for a TPU slice with every weight and input "
        "abstract (shapes and shardings, no values) and have the TPU's own compiler (libtpu, "
        "no TPU needed) compile each program a run compiles: text encoder, transformer(s) "
        "with the guidance passes as the run batches them, VAE. Prints per program and per "
        "chip the memory XLA's TPU memory analysis gives (weights of every component stay "
        "resident) against the chip's HBM, FLOPs, bytes accessed, collectives and compile "
        "time, and a lower bound on a denoising step's time. Exit code 2 when a program "
        "does not fit (or cannot be compiled), naming it and what to change. Needs "
        "libtpu: pip install 'porter[tpu]'.",
        epilog="targets: " + ", ".join(_target_names()) + "  (v4/v5p: the number counts "
        "TensorCores, two per chip; v5e/v6e: chips)")
    compile_.add_argument("recipe", help="path to a recipe YAML file")
    compile_.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                          help="override recipe keys, type-checked (e.g. mesh.tp=8)")
    compile_.add_argument("--target", required=True, metavar="TPU",
                          help="the slice to compile for, as Cloud TPU names it (v6e-8, "
                               "v5e-8 or v5litepod-8, v5p-8, v4-8, v6e-16, ...)")
    compile_.add_argument("--program", action="append", metavar="NAME",
                          help="compile only this program (e.g. transformer.forward, "
                               "vae.decode; repeat for more); every weight still counts")
    compile_.add_argument("--json", action="store_true", help="print the report as JSON")

    verify = commands.add_parser(
        "verify", help="compare the port with PyTorch, module by module",
        description="Run the recipe's transformer as ported (dtypes, sharding, patches, "
        "attention) and in PyTorch (float32, CPU, eager) on identical random inputs; print "
        "the max absolute and relative error of every module matching verify.modules, the "
        "first one over verify.tolerance, and the final output's error. Exit code 3 when "
        "over tolerance.")
    _recipe_args(verify, json=True)
    verify.add_argument("--sharded", action="store_true",
                        help="compare the sharded port with the same port on one device")

    bench = commands.add_parser(
        "bench", help="time one step of the port beside PyTorch eager",
        description="Compile time, steady step time of the ported transformer and of the "
        "same transformer in PyTorch eager (same device, same inputs) and their ratio, "
        "peak memory, FLOPs per step and the fraction of a measured matmul peak. With a "
        "cache: section, also the recipe's denoise stage (its steps) with and without "
        "the cache: wall time, blocks computed, steps skipped, how far the latents moved.")
    _recipe_args(bench, json=True)
    bench.add_argument("--steps", type=int, default=5, metavar="N",
                       help="timed steps after the first (default 5)")

    calibrate = commands.add_parser(
        "calibrate", help="measure MagCache's magnitude ratios for the recipe's model",
        description="Run the recipe's encode and denoise stages once, skipping nothing, "
        "and write MagCache's magnitude ratios (each transformer's, per guidance branch) "
        "to a JSON file that the recipe's cache section names: cache: {method: magcache, "
        "mag_ratios: FILE}. The ratios serve any step count (resampled to it): calibrate "
        "once, at the step count you run most. See docs/caching.md.")
    _recipe_args(calibrate)
    calibrate.add_argument("-o", "--output", metavar="FILE",
                           help="where to write the ratios (default: "
                                "<output.dir>/mag_ratios.json)")
    calibrate.add_argument("--no-progress", action="store_true",
                           help="hide the progress bar")

    inspect = commands.add_parser(
        "inspect", help="tensor name patterns, shapes and matching rules, without weights",
        description="Each component's tensors grouped into name patterns (block numbers as "
        "*) with shapes, dtypes and counts, and which sharding and dtype rule matches each.")
    _recipe_args(inspect, json=True)

    new = commands.add_parser(
        "new", help="write a starter recipe",
        description="Write a commented starter recipe with every section, from a family's "
        "defaults or extending an existing recipe.")
    new.add_argument("name", help="recipe name (written to recipes/NAME.yaml) or a path")
    new.add_argument("--family", required=True, help="model family (`porter plugins`)")
    new.add_argument("--from", dest="base", metavar="EXISTING",
                     help="an existing recipe to extend")
    new.add_argument("--force", action="store_true", help="overwrite an existing file")

    commands.add_parser("plugins", help="list loaded plugins and what they registered")
    commands.add_parser("patches", help="list registered patches with their docs",
                        description="Each patch: its target, the versions it is known to "
                        "fit, whether the target exists in what is installed, and its doc.")
    return parser


def _target_names() -> list[str]:
    from porter.aot.targets import TARGETS

    return list(TARGETS)


def _load_recipe(args):
    from porter import recipe, runtime

    overrides = list(args.overrides)
    if args.cpu_devices is not None:
        overrides.append(f"runtime.cpu_devices={args.cpu_devices}")
    loaded = recipe.load(args.recipe, overrides)
    # JAX reads its platform and device count once, when first imported.
    runtime.configure(loaded.runtime.platform, loaded.runtime.cpu_devices)
    return loaded


def _check_resume_target(resume: str, overrides: list[str]) -> None:
    """``--resume DIR`` names the run directory; an ``output.dir=`` naming another one
    would be ignored without a word: refuse it."""
    from pathlib import Path

    from porter.errors import UsageError

    for override in overrides:
        key, _, value = override.partition("=")
        value = value.strip().strip("'\"")
        if key.strip() == "output.dir" and \
                Path(value).expanduser().absolute() != Path(resume).expanduser().absolute():
            raise UsageError(f"--resume {resume} and {override} name different run "
                             "directories", hint="--resume continues the run in its "
                             "directory: leave output.dir out, or make them the same")


def cmd_run(args) -> int:
    from porter.runtime import distributed
    from porter import plugins
    from porter.commands.run import run

    if args.resume:
        _check_resume_target(args.resume, args.overrides)
        args.overrides = list(args.overrides) + [f"output.dir={args.resume}"]
    distributed.request(args.coordinator, args.num_processes, args.process_id,
                        auto=args.multi_process)
    loaded = _load_recipe(args)
    if args.prompts:
        return _batch(args, loaded)
    result = run(loaded, plugins.registry(), progress=not args.no_progress,
                 stage=args.stage, resume=bool(args.resume))
    timings = result.data["timings"]
    if not distributed.writes():
        print(f"{distributed.label()}done; process 0 wrote the outputs to {result.directory}")
        return 0
    if result.record is None:  # stopped before decoding
        print(f"wrote {', '.join(s + '.safetensors' for s in timings['stages'])} "
              f"to {result.directory}")
        return 0
    outputs = result.data["outputs"]
    made = [name for name in (outputs["video"], outputs["lossless_frames"],
                              outputs["latents"]) if name]
    print(f"wrote {', '.join(made + [result.record.name])} to {result.directory} "
          f"({outputs['frames']} frames, {outputs['width']}x{outputs['height']})")
    compiled = timings["compile"]
    parts = [f"step {timings['step_s']:.3f} s"] if "step_s" in timings else []
    parts += [f"compile {compiled['seconds']:.1f} s (cache: {compiled['cache_hits']} hits, "
              f"{compiled['cache_misses']} misses)"]
    for key, label in (("decode_s", "decode"), ("generate_s", "pipeline")):
        if key in timings:
            parts.append(f"{label} {timings[key]:.2f} s")
    print(", ".join(parts))
    if "cache" in timings:
        print(_cache_line(timings["cache"]))
    return 0


def _cache_line(summary: dict) -> str:
    """One line on what the step cache did."""
    line = (f"cache {summary['method']}: {summary['blocks_computed']} of "
            f"{summary['blocks_total']} transformer blocks computed")
    skipped = summary["skipped_steps"]
    if isinstance(skipped, dict):
        shown = "; ".join(f"{name} {steps}" for name, steps in skipped.items())
    else:  # the guidance cache: steps that reused the unconditional branch
        shown = f"uncond {skipped}"
    return line + (f"; skipped steps: {shown}" if skipped else "; nothing skipped")


def _batch(args, loaded) -> int:
    from pathlib import Path

    from porter.runtime import distributed
    from porter import plugins
    from porter.commands import batch
    from porter.errors import UsageError
    from porter.rundir.outputs import output_dir

    if args.stage:
        raise UsageError("--stage and --prompts do not go together",
                         hint="a batch runs every stage of each item")
    summary = batch.run_batch(loaded, plugins.registry(), Path(args.prompts),
                              progress=not args.no_progress, resume=bool(args.resume))
    if not distributed.writes():
        return 0
    counts = summary["counts"]
    shown = ", ".join(f"{n} {status}" for status, n in counts.items())
    print(f"batch of {len(summary['items'])}: {shown}; "
          f"{summary['timings']['total_s']:.1f} s in all; "
          f"see {summary['summary']} in {output_dir(loaded)}")
    return 2 if counts.get("failed") else 0


def cmd_serve(args) -> int:
    from porter import plugins
    from porter.commands import serve

    loaded = _load_recipe(args)
    state = serve.serve(loaded, plugins.registry(), args.host, args.port, args.token,
                        args.queue, say=lambda message: print(f"porter: {message}",
                                                              file=sys.stderr, flush=True),
                        inputs=args.inputs)
    print("stopped" + (f"; {state['queued']} job(s) left queued for the next start"
                       if state["queued"] else ""), file=sys.stderr)
    return 0


def cmd_validate(args) -> int:
    from porter.port import checks
    from porter import plugins
    from porter.errors import RecipeError

    loaded = _load_recipe(args)
    devices, target = _devices_for(args)
    problems = checks.validate(loaded, plugins.registry(), devices, target)
    if problems:
        print(RecipeError(problems).render(), file=sys.stderr)
        return 2
    where = f" on {target.name} ({devices} chips)" if target else \
        f" on {devices} devices" if devices else ""
    print(f"{args.recipe}: ok ({loaded.model.family}, mesh {dict(loaded.mesh)}{where})")
    return 0


def _checked_recipe(args):
    """The recipe and the registry, after the checks that need neither weights nor JAX
    (the model built from its configuration, as `validate` and `run` build it)."""
    from porter.port import checks
    from porter import plugins
    from porter.errors import RecipeError

    loaded = _load_recipe(args)
    registry = plugins.registry()
    problems = checks.input_problems(loaded, registry)
    if problems:
        raise RecipeError(problems)
    return loaded, registry


def cmd_plan(args) -> int:
    import json

    from porter.port import plan

    loaded, registry = _checked_recipe(args)
    devices, target = _devices_for(args)
    built = plan.build(loaded, registry, devices, target)
    print(json.dumps(plan.to_json(built), indent=2) if args.json else plan.render(built))
    return 2 if built["problems"] else 0


def cmd_compile(args) -> int:
    import json

    from porter import plugins, recipe, runtime
    from porter.commands import compile as report
    from porter.aot import targets

    target = targets.named(args.target)
    # the host compiles: JAX runs on the CPU; libtpu only describes the target
    os.environ["JAX_PLATFORMS"] = "cpu"
    runtime.quiet_libtpu()
    loaded = recipe.load(args.recipe, list(args.overrides))
    built = report.build(loaded, plugins.registry(), target.name, only=args.program,
                         say=lambda message: print(f"porter: {message}", file=sys.stderr,
                                                   flush=True))
    print(json.dumps(built, indent=2) if args.json else report.render(built))
    verdict = built["verdict"]
    if verdict["fits"]:
        return 0
    print(f"error: {verdict['message']}" + (f"\n  hint: {verdict['hint']}"
                                             if verdict["hint"] else ""), file=sys.stderr)
    return 2


def cmd_verify(args) -> int:
    import json

    from porter import plugins
    from porter.commands import verify

    loaded = _load_recipe(args)
    result = verify.verify(loaded, plugins.registry(), sharded=args.sharded)
    print(json.dumps(result, indent=2) if args.json else verify.render(result))
    return 0 if result["ok"] else 3


def cmd_bench(args) -> int:
    import json

    from porter import plugins
    from porter.commands import bench

    loaded = _load_recipe(args)
    result = bench.bench(loaded, plugins.registry(), steps=args.steps)
    print(json.dumps(result, indent=2) if args.json else bench.render(result))
    return 0


def cmd_calibrate(args) -> int:
    import os.path

    from porter.runtime import distributed
    from porter.commands.calibrate import calibrate

    loaded = _load_recipe(args)
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


def cmd_inspect(args) -> int:
    import json

    from porter.commands import inspect as inspection

    loaded, registry = _checked_recipe(args)
    result = inspection.build(loaded, registry)
    print(json.dumps(result, indent=2) if args.json else inspection.render(result))
    return 0


def cmd_new(args) -> int:
    from porter import plugins
    from porter.commands import new as starter

    path = starter.write(args.name, plugins.registry().family(args.family), args.base,
                         force=args.force)
    print(f"wrote {path}; next: porter validate {path}")
    return 0


def cmd_plugins(args) -> int:
    from porter import plugins

    registry = plugins.registry()
    for name in registry.plugins:
        items = registry.registered_by(name)
        print(f"{name}: " + (", ".join(items) if items else "registers nothing yet"))
        for item in items:
            kind, _, family = item.partition(" ")
            if kind == "family":
                print(f"    {registry.families[family].summary}")
    return 0


def cmd_patches(args) -> int:
    import textwrap

    from porter import plugins
    from porter.transforms.patches import PatchError

    registry = plugins.registry()
    for name in sorted(registry.patches):
        patch = registry.patches[name]
        try:
            patch.locate()
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


COMMANDS = {"run": cmd_run, "serve": cmd_serve, "validate": cmd_validate, "plan": cmd_plan,
            "compile": cmd_compile, "verify": cmd_verify, "bench": cmd_bench, "calibrate": cmd_calibrate,
            "inspect": cmd_inspect, "new": cmd_new,
            "plugins": cmd_plugins, "patches": cmd_patches}


def _quiet_libraries() -> None:
    """Library chatter (deprecations, dtype notes) hides Porter's own output."""
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import logging

    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.set_verbosity_error()
    transformers_logging.set_verbosity_error()
    for name in ("jax", "absl"):
        logging.getLogger(name).setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # Overrides may come before or after flags: collect stray KEY=VALUE words.
    args, extra = parser.parse_known_args(argv)
    stray = [word for word in extra if "=" not in word or word.startswith("-")]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = list(args.overrides) + extra
    if not args.debug:
        _quiet_libraries()
    try:
        with interrupt.terminate_raises():
            return COMMANDS[args.command](args)
    except Interrupted as exc:
        kept = f"; kept: {exc.saved} (continue with --resume)" if exc.saved else ""
        print(f"interrupted by {exc}{kept}", file=sys.stderr)
        return exc.exit_code
    except PorterError as exc:
        if args.debug:
            raise
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        refused = _environment_cause(exc)
        if refused is not None:  # the machine refused (disk full, ...): not a Porter bug
            problem = environment_problem(refused)
            print(problem.render(), file=sys.stderr)
            return problem.exit_code
        print(f"internal error: {type(exc).__name__}: {exc}\n"  # a Porter bug: say so
              "  hint: rerun with --debug for the traceback and report it", file=sys.stderr)
        return 1


def _environment_cause(exc: BaseException) -> OSError | None:
    """The OSError the machine gave, if it is what ``exc`` is or was raised from
    (``raise ... from``; an error merely raised while handling one is not)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if is_environment_error(exc):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__
    return None

if __name__ == "__main__":
    sys.exit(main())
