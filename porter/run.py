"""One run: recipe -> plugin -> pipeline -> JAX (compiled) -> video + record."""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from porter import checks, loading, patches, record, runtime as runtime_mod, stages, video
from porter.errors import RecipeError
from porter.transforms import compile as compile_transform
from porter.transforms import attention, rotary
from porter.transforms import sharding as shard_transform


@dataclass
class RunResult:
    directory: Path
    video: Path
    record: Path
    latents: object  # CPU torch tensor: the final latents
    frames: object  # uint8 array (count, height, width, 3)
    data: dict  # the run record


def output_dir(recipe) -> Path:
    return Path(recipe.output.dir or Path("outputs") / recipe.name)


def port(pipe, family, runtime, recipe) -> None:
    """Move every component to JAX, sharded by the recipe; compile what the family names."""
    sharding = recipe.sharding
    compiled = compile_transform.rules(recipe, family)
    for name, component in pipe.components.items():
        if not isinstance(component, torch.nn.Module):
            continue
        shard_transform.apply(component, runtime, sharding.weights.get(name, []))
        shard_transform.constrain_activations(component, runtime,
                                              sharding.activations.get(name, []))
        if name == "transformer" and recipe.rotary.precompute:
            rotary.apply(pipe, family, recipe, runtime)
        if name in compiled:
            component = compile_transform.apply(component, compiled[name])
            if name == "transformer" and sharding.inputs:
                component = shard_transform.ShardedInputs(component, sharding.inputs, runtime)
        if name in recipe.attention.skip:
            component = attention.Skipped(component)
        setattr(pipe, name, component)


def selected_patches(recipe, registry, family):
    """The recipe's patches, plus the family's rotary patch when tables are precomputed."""
    extra = (family.rotary_patch,) if recipe.rotary.precompute else ()
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


def _generate(family, recipe, runtime, registry, say, progress):
    """Load, port, encode, denoise, decode; returns latents, frames and timings."""
    timings: dict = {}
    monitor = runtime_mod.compile_monitor()
    compile_before = monitor.summary()
    say(f"loading {family.name} from {recipe.model.source} ({recipe.model.dtype})")
    start = time.perf_counter()
    pipe = loading.load_pipeline(family, recipe)
    timings["load_s"] = round(time.perf_counter() - start, 4)
    start = time.perf_counter()
    port(pipe, family, runtime, recipe)
    timings["to_jax_s"] = round(time.perf_counter() - start, 4)

    with attention_installed(recipe, registry, runtime):
        say("encoding the prompt")
        conditioning = stages.encode(family, pipe, recipe, runtime, timings)
        latents = stages.denoise(family, pipe, conditioning, recipe, runtime, timings,
                                 progress)
        say("decoding latents to frames")
        frames = stages.decode(family, pipe, latents, recipe, runtime, timings)
    compile_after = monitor.summary()
    timings["compile"] = {key: round(compile_after[key] - compile_before[key], 4)
                          for key in compile_after}
    return latents, frames, timings


def _status(message: str) -> None:
    print(f"porter: {message}", file=sys.stderr, flush=True)


def run(recipe, registry, progress: bool = True) -> RunResult:
    runtime_mod.configure(recipe.runtime.platform, recipe.runtime.cpu_devices)
    problems = checks.recipe_problems(recipe, registry)
    if problems:
        raise RecipeError(problems)
    family = registry.family(recipe.model.family)
    say = _status if progress else (lambda message: None)
    runtime = runtime_mod.start(recipe)
    say(f"JAX on {runtime.mesh.devices.size} {runtime.device_kind} device(s), "
        f"mesh {runtime.axes}")
    problems = checks.shape_problems(recipe, registry)  # before any weight is read
    problems += attention.platform_problems(recipe, registry, runtime.platform)
    if problems:
        raise RecipeError(problems)
    chosen = selected_patches(recipe, registry, family)
    with patches.applied(chosen):
        latents, frames, timings = _generate(family, recipe, runtime, registry, say, progress)

    directory = output_dir(recipe)
    directory.mkdir(parents=True, exist_ok=True)
    video_path = video.write_mp4(directory / "video.mp4", frames, recipe.output.fps)
    outputs = {"video": video_path.name, "frames": int(frames.shape[0]),
               "height": int(frames.shape[1]), "width": int(frames.shape[2])}
    data = record.build(recipe, runtime, timings, outputs, chosen)
    record_path = record.write_json(directory / "run.json", data)
    return RunResult(directory, video_path, record_path, latents, frames, data)
