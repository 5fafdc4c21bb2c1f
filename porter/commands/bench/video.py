"""`porter bench --video`: a whole video of the recipe, as a user waits for it, beside
diffusers' own pipeline making the same video on the same machine.

Porter: the port loaded (and its time), then the recipe's video made twice in the
same process: cold (every program traced and compiled, JAX's and Porter's caches
empty and private to the benchmark) and warm (the programs in memory), each with its
stages from the run record (text encoding, steps, decode). diffusers: the same
checkpoint loaded as a plain PyTorch pipeline in the recipe's dtypes (its own load
time), its ``__call__`` with the recipe's settings twice (the first call pays PyTorch's
one-time costs); with ``torch_compile``, its transformer under ``torch.compile`` too
(its first call compiles). The same device where PyTorch can run there (a GPU), else
the host. Process start-up is not in these figures: a run's record has it
(``timings.startup_s``). The port keeps no text encodings here
(``runtime.text_cache_mb: 0``): the warm video encodes its prompt again, as diffusers'
does.

A benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import gc
import tempfile
import time
from typing import TYPE_CHECKING

import torch

from porter import api, loading
from porter import recipe as recipe_mod
from porter.commands.bench import _reference_device
from porter.errors import UsageError
from porter.port import checks
from porter.recipe import call_args, modular
from porter.runtime import memory

if TYPE_CHECKING:
    from porter.recipe import Recipe
    from porter.registry import Registry


def bench_video(recipe: Recipe, registry: Registry, torch_compile: bool = False) -> dict:
    """The whole-video figures of Porter and of diffusers for ``recipe``."""
    family = checks.checked_family(recipe, registry)
    cls = family.pipeline_class(recipe)
    if modular.is_modular(cls):
        raise UsageError(f"{cls.__name__} is a modular pipeline: its blocks have no "
                         "single call to time beside Porter's",
                         hint="bench --video takes a classic pipeline's recipe")
    ported = porter_video(recipe)
    peer = diffusers_video(recipe, family, ported["platform"], compiled=False)
    compiled = diffusers_video(recipe, family, ported["platform"], compiled=True) \
        if torch_compile else None
    best = min(peer["warm_s"], compiled["warm_s"]) if compiled else peer["warm_s"]
    return {"recipe": recipe.name, "porter": ported, "diffusers": peer,
            "diffusers_torch_compile": compiled,
            "warm_ratio": round(ported["warm_s"] / best, 3),
            "memory": memory.peak_memory(ported["platform"])}


def porter_video(recipe: Recipe) -> dict:
    """The port loaded with compile caches of its own (empty: the first video is a cold
    one), then two videos."""
    with tempfile.TemporaryDirectory(prefix="porter-bench-video-") as private:
        # caches of its own; no text encodings kept: the warm video encodes its prompt
        # as diffusers' does (a server that sees it again skips that: timings.text_encoding)
        recipe = recipe_mod.with_values(recipe, "runtime", {"compile_cache": private,
                                                            "text_cache_mb": 0},
                                        "porter bench --video")
        start = time.perf_counter()
        port = api.load(recipe)
        loaded_s = time.perf_counter() - start
        with port:
            cold, cold_s = _timed(port.generate)
            warm, warm_s = _timed(port.generate)
    return {"platform": port.runtime.platform, "device": port.runtime.device_kind,
            "devices": int(port.runtime.mesh.devices.size), "load_s": round(loaded_s, 3),
            "cold_s": round(cold_s, 3), "warm_s": round(warm_s, 3),
            "cold": _stages(cold.record["timings"]), "warm": _stages(warm.record["timings"]),
            "frames": list(warm.frames.shape)}


def _stages(timings: dict) -> dict:
    """A generation's seconds by stage, from its record."""
    steps = timings.get("steps_s") or []
    return {"encode_s": timings.get("encode_s"), "steps_s": round(sum(steps), 4),
            "steps": len(steps), "decode_s": timings.get("decode_s"),
            "compile_s": (timings.get("compile") or {}).get("seconds")}


def diffusers_video(recipe: Recipe, family, platform: str, compiled: bool) -> dict:
    """diffusers' pipeline, loaded as a user loads it, making the recipe's video."""
    device = _reference_device(platform)
    start = time.perf_counter()
    pipe = loading.load_pipeline(family, recipe).to(device)
    if hasattr(pipe, "set_progress_bar_config"):
        pipe.set_progress_bar_config(disable=True)
    if compiled:
        pipe.transformer = torch.compile(pipe.transformer)
    loaded_s = time.perf_counter() - start
    kwargs = call_args.kwargs(recipe, type(pipe))

    def video():
        if "generator" in kwargs:  # each video from the seed, as Porter's
            kwargs["generator"].manual_seed(recipe.generate.seed)
        with torch.inference_mode():
            return pipe(**kwargs)

    _, first_s = _timed(video, sync=device.type == "cuda")
    _, warm_s = _timed(video, sync=device.type == "cuda")
    del pipe
    gc.collect()
    return {"device": str(device), "load_s": round(loaded_s, 3),
            "first_s": round(first_s, 3), "warm_s": round(warm_s, 3)}


def _timed(call, sync: bool = False):
    start = time.perf_counter()
    made = call()
    if sync:
        torch.cuda.synchronize()
    return made, time.perf_counter() - start


def render(result: dict) -> str:
    ported, peer = result["porter"], result["diffusers"]
    warm = ported["warm"]
    lines = [
        f"{result['recipe']}: a whole video ({' x '.join(map(str, ported['frames']))}) on "
        f"{ported['devices']} {ported['device']} device(s)",
        f"  porter:    load {ported['load_s']:.2f} s; cold {ported['cold_s']:.2f} s "
        f"(compile {ported['cold']['compile_s'] or 0:.2f} s), warm {ported['warm_s']:.2f} s: "
        f"encode {warm['encode_s']} s, {warm['steps']} steps {warm['steps_s']} s, "
        f"decode {warm['decode_s']} s",
        f"  diffusers: load {peer['load_s']:.2f} s; first {peer['first_s']:.2f} s, "
        f"warm {peer['warm_s']:.2f} s ({peer['device']})"]
    compiled = result["diffusers_torch_compile"]
    if compiled:
        lines.append(f"  diffusers + torch.compile: first {compiled['first_s']:.2f} s "
                     f"(compiles), warm {compiled['warm_s']:.2f} s")
    lines.append(f"  warm whole video, porter / best peer: {result['warm_ratio']:.3g}")
    return "\n".join(lines)
