"""porter run: generate a video from a recipe (or, with --prompts, a batch of them)."""

from __future__ import annotations

from pathlib import Path

from porter.cli import common
from porter.errors import UsageError
from porter.rundir.outputs import output_dir
from porter.runtime import distributed

HELP = "generate a video from a recipe"


def add(commands) -> None:
    parser = commands.add_parser(
        "run", help=HELP,
        description="Load the recipe's model, port it to JAX, generate, and write "
        "video.mp4 and run.json to output.dir (default outputs/<recipe name>). Each stage "
        "(encode, denoise, decode) also leaves its output there, so a run can be split "
        "(--stage) or continued (--resume).")
    common.recipe_args(parser)
    parser.add_argument("--no-progress", action="store_true",
                        help="hide the progress bar and the status lines (warnings and "
                             "errors still show)")
    parser.add_argument("--stage", choices=("encode", "denoise", "decode"),
                        help="run one stage; its input comes from the run directory")
    parser.add_argument("--resume", metavar="DIR",
                        help="continue the run in DIR after its last complete stage or "
                             "denoising checkpoint (with --prompts: the batch in DIR)")
    parser.add_argument("--prompts", metavar="FILE",
                        help="a batch on one load and compile: one prompt a line, or JSON "
                             "Lines (.jsonl) of generate settings and an optional name; "
                             "each item goes to its own folder of output.dir, with "
                             "batch.json")
    common.process_args(parser, "multi-process runs", "Start one `porter run` per process "
                        "(per host), each with the same recipe and coordinator; the mesh "
                        "spans every process's devices and process 0 writes the outputs.")


def handle(args) -> int:
    # lazy: only the subcommand asked for is imported
    from porter import registry as registry_mod
    from porter.commands.run import run  # lazy: only the subcommand asked for is imported

    if args.resume:
        _check_resume_target(args.resume, args.overrides)
        args.overrides = list(args.overrides) + [f"output.dir={args.resume}"]
    common.request_processes(args)
    loaded = common.load_recipe(args)
    if args.prompts:
        return _batch(args, loaded)
    result = run(loaded, registry_mod.loaded(), progress=not args.no_progress,
                 stage=args.stage, resume=bool(args.resume))
    if result.finished:
        kept = [path.name for path in (result.video, result.record) if path is not None]
        held = f" ({', '.join(kept)})" if kept else ""
        print(f"{distributed.label()}nothing run: {result.directory} holds this recipe's "
              f"finished run{held}; run without --resume to make it again")
        return 0
    if not distributed.writes():
        print(f"{distributed.label()}done; process 0 wrote the outputs to {result.directory}")
        return 0
    timings = result.data["timings"]
    if result.record is None:  # stopped before decoding
        print(f"wrote {', '.join(s + '.safetensors' for s in timings['stages'])} "
              f"to {result.directory}")
        return 0
    outputs = result.data["outputs"]
    sound = outputs.get("audio") or {}
    stream = (timings.get("stream") or {}).get("file")  # the frames as they came
    made = [name for name in (outputs["video"], stream, outputs["lossless_frames"],
                              sound.get("wav"), outputs["latents"]) if name]
    heard = (f", sound {sound['seconds']} s at {sound['sample_rate']} Hz"
             if sound.get("in_video") else "")
    print(f"wrote {', '.join(made + [result.record.name])} to {result.directory} "
          f"({outputs['frames']} frames, {outputs['width']}x{outputs['height']}{heard})")
    print(_timings_line(timings))
    if "cache" in timings:
        print(_cache_line(timings["cache"]))
    return 0


def _check_resume_target(resume: str, overrides: list[str]) -> None:
    """``--resume DIR`` names the run directory; an ``output.dir=`` naming another one
    would be ignored without a word: refuse it."""
    for override in overrides:
        key, _, value = override.partition("=")
        value = value.strip().strip("'\"")
        if key.strip() == "output.dir" and \
                Path(value).expanduser().absolute() != Path(resume).expanduser().absolute():
            raise UsageError(f"--resume {resume} and {override} name different run "
                             "directories", hint="--resume continues the run in its "
                             "directory: leave output.dir out, or make them the same")


def _timings_line(timings: dict) -> str:
    compiled = timings["compile"]
    parts = [f"step {timings['step_s']:.3f} s"] if "step_s" in timings else []
    parts += [f"compile {compiled['seconds']:.1f} s (cache: {compiled['cache_hits']} hits, "
              f"{compiled['cache_misses']} misses)"]
    for key, label in (("decode_s", "decode"), ("generate_s", "pipeline")):
        if key in timings:
            parts.append(f"{label} {timings[key]:.2f} s")
    shown = (timings.get("stream") or {}).get("first_playable_s")
    if shown is not None:
        parts.append(f"stream.mp4 playable {shown:.2f} s after the call began")
    return ", ".join(parts)


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
    # lazy: only the subcommand asked for is imported
    from porter import registry as registry_mod
    from porter.commands import batch  # lazy: only the subcommand asked for is imported

    if args.stage:
        raise UsageError("--stage and --prompts do not go together",
                         hint="a batch runs every stage of each item")
    summary = batch.run_batch(loaded, registry_mod.loaded(), Path(args.prompts),
                              progress=not args.no_progress, resume=bool(args.resume))
    if not distributed.writes():
        return 0
    counts = summary["counts"]
    shown = ", ".join(f"{n} {status}" for status, n in counts.items())
    print(f"batch of {len(summary['items'])}: {shown}; "
          f"{summary['timings']['total_s']:.1f} s in all; "
          f"see {summary['summary']} in {output_dir(loaded)}")
    return 2 if counts.get("failed") or counts.get("replaced") else 0
