"""One run: recipe -> plugin -> pipeline -> JAX (compiled) -> video + record."""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from porter import artifacts, checks, distributed, loading, patches, record, runtime as runtime_mod
from porter import progress as saved_progress
from porter import outputs, schedulers, stages, tracing, video
from porter.errors import LoadError, RecipeError, UsageError
from porter.interop import to_device
from porter.transforms import compile as compile_transform
from porter.transforms import setup as setup_transform
from porter.transforms import attention, placement, rotary
from porter.transforms import sharding as shard_transform


@dataclass
class RunResult:
    directory: Path
    video: Path | None  # None when the run stopped before decoding
    record: Path | None
    latents: object  # CPU torch tensor: the final latents (None after encode only)
    frames: object  # uint8 array (count, height, width, 3), or None
    data: dict  # the run record


def output_dir(recipe) -> Path:
    return Path(recipe.output.dir or Path("outputs") / recipe.name)


@dataclass
class Ported:
    traces: object  # the TraceCache used (None when the compile cache is off)
    weights: dict  # component -> where its weights came from and what each device holds
    splits: dict  # component -> autosplit.Split: what could not be compiled whole


def port(pipe, family, runtime, recipe, weights: dict | None = None) -> Ported:
    """Place every component's tensors on the mesh, sharded by the recipe (read from
    ``weights``, component -> ComponentWeights, where given); cache rotary tables;
    compile what the family (or the recipe) names. Weights holding NaN or infinity
    are refused (``model.allow_nonfinite``: a warning)."""
    sharding = recipe.sharding
    weights = weights or {}
    modules = {n: c for n, c in pipe.components.items() if isinstance(c, torch.nn.Module)}
    placed, unsharded, nonfinite = {}, set(), {}
    for name, component in modules.items():
        found: dict = {}
        assignments = placement.apply(component, runtime, sharding.weights.get(name, []),
                                      weights.get(name), found)
        nonfinite.update({f"{name}.{tensor}": count for tensor, count in found.items()})
        placed[name] = placement.report(component, assignments, runtime.axes,
                                        weights.get(name))
        activations = sharding.activations.get(name, [])
        shard_transform.constrain_activations(component, runtime, activations)
        if placement.unsharded(assignments, activations):
            unsharded.add(name)
    _refuse_nonfinite(nonfinite, recipe)
    if recipe.rotary.precompute:
        rotary.apply(pipe, family, recipe, runtime)
    compiled = compile_transform.rules(recipe, family)
    traces = trace_cache(recipe, family, runtime)
    splits: dict = {}
    for name, component in modules.items():
        if name in compiled:
            component = compile_transform.apply(component, compiled[name], traces, name,
                                                runtime.xla_options, splits)
            if name.startswith("transformer") and sharding.inputs:
                component = shard_transform.ShardedInputs(component, sharding.inputs, runtime)
            elif name in unsharded and runtime.mesh.devices.size > 1 \
                    and compiled[name].modules is None:
                placement.on_one_device(component, runtime)
        if name in recipe.attention.skip:
            component = attention.Skipped(component)
        setattr(pipe, name, component)
    return Ported(traces, placed, splits)


def _refuse_nonfinite(found: dict, recipe) -> None:
    """NaN or infinity in the weights (``found``: tensor -> count, this process's rows)
    is an error on every process, decided together so that none runs on alone."""
    from porter import notices

    if not distributed.anywhere(bool(found)):
        return
    shown = ", ".join(f"{name} ({count})" for name, count in list(found.items())[:6])
    more = f" and {len(found) - 6} more" if len(found) > 6 else ""
    what = (f"NaN or infinite values in {len(found)} weight tensor(s): {shown}{more}"
            if found else "NaN or infinite values in weights another process read")
    if recipe.model.allow_nonfinite:
        notices.warn(what + " (allowed by model.allow_nonfinite)")
        return
    raise LoadError(what, hint="the checkpoint is damaged, was saved from a diverged model, "
                    "or holds values too large for model.dtype (float16 ends at 65504); "
                    "re-download or re-save it, or use a wider dtype (model.allow_nonfinite:"
                    " true loads it anyway)")


#: recipe keys that never reach a traced program: what a video is made from (its
#: values enter as inputs, their shapes are in every trace key anyway) and where
#: the results go. Changing them keeps the stored traces.
NOT_TRACED = ("output", "verify", "generate.prompt", "generate.negative_prompt",
              "generate.seed", "generate.image", "generate.last_image",
              # fused into the weights before tracing: the programs take weights as inputs
              "lora")


def traced_settings(recipe) -> str:
    """The recipe's settings that a traced program may depend on, as canonical JSON."""
    import json

    data = recipe.resolved()
    for dotted in NOT_TRACED:
        *parents, last = dotted.split(".")
        owner = data
        for parent in parents:
            owner = owner.get(parent) or {}
        owner.pop(last, None)
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def trace_cache(recipe, family, runtime):
    """Traced programs beside the compile cache (none when the cache is off)."""
    import hashlib

    from porter.transforms.trace_cache import TraceCache, code_fingerprint
    if runtime.cache is None:
        return None
    from porter import plugins

    # the code a trace runs: Porter, the family, and whatever plugins patch or attend with
    registry = plugins.registry()
    registry_modules = [type(family).__module__,
                        *(p.replacement.__module__ for p in registry.patches.values()),
                        *(b.kernel.__module__ for b in registry.attention.values())]
    parts = [traced_settings(recipe), repr(record.versions()), repr(runtime.axes),
             code_fingerprint(["porter", *registry_modules])]
    return TraceCache(runtime.cache / "porter-traces",
                      hashlib.sha256("\n".join(parts).encode()).hexdigest())


#: patches every run applies: they make torchax behave as PyTorch does
CORE_PATCHES = ("core.setitem",)


def selected_patches(recipe, registry, family):
    """The recipe's patches, plus the core's (``CORE_PATCHES``), the family's required
    ones and its rotary patch when tables are precomputed."""
    extra = CORE_PATCHES + family.required_patches
    if recipe.rotary.precompute:
        extra += (family.rotary_patch_for(recipe),)
    return patches.selected(recipe, registry, extra)


@contextlib.contextmanager
def attention_installed(recipe, registry, runtime):
    """The recipe's attention backend in place of torchax's lowering, for the block."""
    if recipe.attention.backend is None:
        yield
        return
    undo = attention.install(runtime.env, recipe.attention, registry.attention, runtime.mesh,
                             runtime.platform)
    try:
        yield
    finally:
        undo()


def stages_to_run(directory: Path, stage: str | None, resume: bool) -> tuple[str, ...]:
    """One named stage; after the last complete one (resume); or all three."""
    if stage is not None:
        return (stage,)
    if resume:
        done = [s for s in artifacts.STAGES[:-1] if artifacts.complete(directory, s)]
        start = artifacts.STAGES.index(done[-1]) + 1 if done else 0
        return artifacts.STAGES[start:]
    return artifacts.STAGES


@dataclass
class Resumed:
    """What a run continues from: the stage before its first (record and tensors) and
    the denoising checkpoint, both read and checked before any weight is loaded."""
    previous: dict | None = None  # {"meta": record, "tensors": {...}}
    progress: object = None  # porter.progress.Progress


def _inputs(directory: Path, wanted: tuple[str, ...], recipe, resume: bool) -> Resumed:
    """The inputs on disk this run needs, checked now: a bad file fails before loading."""
    found = Resumed()
    first = artifacts.STAGES.index(wanted[0]) if wanted else 0
    if first:
        meta, tensors = artifacts.load_with_record(directory, artifacts.STAGES[first - 1],
                                                   recipe)
        found.previous = {"meta": meta, "tensors": tensors}
    if resume and "denoise" in wanted:
        found.progress = saved_progress.load(directory, recipe)
    return found


def _generate(family, recipe, runtime, registry, say, progress, wanted, directory,
              inputs: Resumed):
    """Load and port the pipeline, then run the wanted stages (inputs from disk if
    the stage before did not run here). Returns latents, frames, timings, what was
    placed, the checkpoint's identity and where each stage ran (history)."""
    timings: dict = {}
    monitor = runtime_mod.compile_monitor()
    compile_before = monitor.summary()
    say(f"loading {family.name} from {recipe.model.source} ({recipe.model.dtype})")
    start = time.perf_counter()
    pipe, weights, checkpoint = loading.load_for_port(family, recipe)
    timings["load_s"] = round(time.perf_counter() - start, 4)
    set_up = setup_transform.apply(pipe, recipe)
    if set_up:
        say(f"set up: {', '.join(set_up)}")
    say("placing weights on the mesh" + (f" ({', '.join(weights)} read from the "
                                          "checkpoint tensor by tensor)" if weights else ""))
    start = time.perf_counter()
    ported = port(pipe, family, runtime, recipe, weights)
    timings["to_jax_s"] = round(time.perf_counter() - start, 4)
    traces = ported.traces

    conditioning = latents = frames = None
    previous = inputs.previous
    history = list(previous["meta"].get("history") or []) if previous else []
    with attention_installed(recipe, registry, runtime), \
            schedulers.on_device(getattr(pipe, "scheduler", None), runtime):
        if not family.staged:
            say("running the pipeline")
            start = time.perf_counter()
            with runtime.env:
                frames = family.generate(pipe, recipe)
            timings["generate_s"] = round(time.perf_counter() - start, 4)
            history.append(record.segment(runtime, "generate"))
            wanted = ()
        if "encode" in wanted:
            say("encoding the prompt")
            conditioning = stages.encode(family, pipe, recipe, runtime, timings)
            history.append(record.segment(runtime, "encode"))
            artifacts.save(directory, "encode", conditioning, recipe,
                           extra={"history": history})
        if "denoise" in wanted:
            if conditioning is None:
                conditioning = {k: to_device(v, runtime)
                                for k, v in previous["tensors"].items()}
            resumed = inputs.progress
            if resumed is not None:
                say(f"continuing denoising after step {resumed.step}")
                history = list(resumed.history) or history
            first_step = resumed.step if resumed else 0

            def ran(done: int) -> list:
                return history + [record.segment(runtime, "denoise", steps=[first_step, done])]

            def save(done):
                done.history = ran(done.step)
                saved_progress.save(directory, done, recipe)
            latents = stages.denoise(family, pipe, conditioning, recipe, runtime, timings,
                                     progress, start=resumed, save=save)
            history = ran(first_step + len(timings["steps_s"]))
            artifacts.save(directory, "denoise", {"latents": latents}, recipe,
                           extra={"history": history})
            saved_progress.discard(directory)
        if "decode" in wanted:
            if latents is None:
                latents = previous["tensors"]["latents"]
            say("decoding latents to frames")
            frames = stages.decode(family, pipe, latents, recipe, runtime, timings)
            history.append(record.segment(runtime, "decode"))
    compile_after = monitor.summary()
    timings["compile"] = {key: round(compile_after[key] - compile_before[key], 4)
                          for key in compile_after}
    if traces is not None:
        timings["compile"].update(traces_loaded=traces.loaded, traces_saved=traces.exported)
    split = {name: s.report() for name, s in ported.splits.items() if s.report()}
    if split:
        timings["compile"]["split"] = split
    return latents, frames, timings, ported.weights, checkpoint, history


def _status(message: str) -> None:
    print(f"porter: {distributed.label()}{message}", file=sys.stderr, flush=True)


def _resume_problem(directory: Path, resume: bool) -> None:
    if resume and not directory.is_dir():
        raise UsageError(f"nothing to resume: {directory} does not exist"
                         if not directory.exists() else
                         f"nothing to resume: {directory} is not a directory",
                         hint="--resume takes the output directory of an earlier run; "
                              "to start a new run, leave --resume out")


def run(recipe, registry, progress: bool = True, stage: str | None = None,
        resume: bool = False) -> RunResult:
    """Run the recipe: every stage, one ``stage``, or (``resume``) what is left.

    The run owns its output directory while it runs (another run into it is
    refused), and first removes the files of an older run that its own replace."""
    family = checks.checked_family(recipe, registry)
    say = _status if progress else (lambda message: None)
    directory = output_dir(recipe)
    if not family.staged and (stage or resume):
        raise UsageError(f"family {family.name!r} runs the pipeline in one piece: "
                         "--stage and --resume need a family with stages",
                         hint="run it without --stage/--resume")
    _resume_problem(directory, resume)
    distributed.initialize()  # before anything asks JAX which process this is
    with contextlib.ExitStack() as owner:
        refused = None
        if distributed.writes():
            try:
                owner.enter_context(outputs.owned(directory))
            except UsageError as exc:
                refused = exc
        # every process stops if process 0 cannot own the directory (none is left
        # waiting in a collective for it)
        if distributed.anywhere(refused is not None):
            raise refused or UsageError(f"process 0 cannot write {directory}",
                                        hint="see process 0's message")
        return _owned_run(family, recipe, registry, say, progress, stage, resume, directory)


def _owned_run(family, recipe, registry, say, progress, stage, resume, directory):
    wanted = stages_to_run(directory, stage, resume) if family.staged else ()
    inputs = _inputs(directory, wanted, recipe, resume)  # before anything is removed
    if distributed.writes():
        outputs.invalidate(directory, wanted, keep_progress=inputs.progress is not None)
    if resume:
        say(f"resuming in {directory}: running {', '.join(wanted)}")
    runtime = runtime_mod.start(recipe)
    say(f"JAX on {runtime.mesh.devices.size} {runtime.device_kind} device(s), "
        f"mesh {runtime.axes}" + (f", {distributed.process_count()} processes; process 0 "
                                  "writes the outputs" if distributed.process_count() > 1
                                  else ""))
    progress = progress and distributed.writes()  # one progress bar, not one per process
    problems = checks.shape_problems(recipe, registry)  # before any weight is read
    problems += attention.platform_problems(recipe, registry, runtime.platform)
    if problems:
        raise RecipeError(problems)

    chosen = selected_patches(recipe, registry, family)
    with patches.applied(chosen), tracing.explained():
        latents, frames, timings, placed, checkpoint, history = _generate(
            family, recipe, runtime, registry, say, progress, wanted, directory, inputs)
    timings["stages"] = list(wanted) if family.staged else ["generate"]
    if frames is None:
        return RunResult(directory, None, None, latents, None,
                         {"timings": timings, "weights": record.weights(placed, timings)})
    described = {"video": outputs.VIDEO, "frames": int(frames.shape[0]),
                 "height": int(frames.shape[1]), "width": int(frames.shape[2])}
    if not distributed.writes():
        data = record.build(recipe, runtime, timings, described, chosen, placed, checkpoint,
                            history)
        return RunResult(directory, None, None, latents, frames, data)
    digest = video.write_mp4(directory / outputs.VIDEO, frames, recipe.output.fps)
    described["files"] = {outputs.VIDEO: digest,
                          **(stage_digests(directory) if family.staged else {})}
    data = record.build(recipe, runtime, timings, described, chosen, placed, checkpoint,
                        history)
    # the record last: it is what makes the directory's files one complete run
    record_path = record.write_json(directory / outputs.RECORD, data)
    return RunResult(directory, directory / outputs.VIDEO, record_path, latents, frames, data)


def stage_digests(directory: Path) -> dict:
    """SHA-256 of each stage file in the directory, from its record."""
    import json

    found = {}
    for stage in artifacts.STAGES[:-1]:
        if artifacts.complete(directory, stage):
            meta = json.loads((directory / f"{stage}.json").read_text())
            found[f"{stage}.safetensors"] = meta.get("sha256")
    return found
