"""`porter bench`: one denoising step of the ported transformer beside PyTorch eager
(and, for a recipe with ``cache:``, its denoise stage with and without the cache).

Measured in the same process on the same inputs: compile time (and how much
came from the persistent cache), steady time per step for the port and for
PyTorch, their ratio, peak memory, analytic FLOPs per step and the achieved
FLOP/s, also as a fraction of a matmul peak measured here on the same device.
A benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from porter import api, loading
from porter import runtime as runtime_mod
from porter.commands.bench import torch_peer
from porter.generate.call import Call
from porter.generate.stages import block
from porter.port import active, beside, checks
from porter.runtime import compile_cache, memory, monitor
from porter.shims.interop import to_device
from porter.stepcache import without_cache
from porter.transforms import patches

if TYPE_CHECKING:
    from porter.recipe import Recipe
    from porter.registry import Registry
    from porter.runtime import Runtime


def _median_seconds(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_peak(size: int | None = None, dtype: str = "float32", repeats: int = 5) -> float:
    """FLOP/s of one large square matmul of random values on the default JAX device.

    4096 on a CPU (seconds a product); 16384 on an accelerator, where a 4096 product
    takes a fraction of a millisecond and the launch counts: an H200 read 378-442
    TFLOP/s in bfloat16 at 4096, below what Wan's own step reached there."""
    import jax

    if size is None:
        size = 4096 if jax.default_backend() == "cpu" else 16384
    a = jax.random.normal(jax.random.key(0), (size, size), dtype)  # ones can run faster
    multiply = jax.jit(lambda x: x @ x)
    multiply(a).block_until_ready()
    seconds = _median_seconds(lambda: multiply(a).block_until_ready(), repeats)
    return 2 * size ** 3 / seconds


def _first_call(call, monitor) -> dict:
    """Time a call that has to trace and compile, and what the compile cache did."""
    import jax

    jax.clear_caches()  # forget in-memory executables: trace, lower, then compile or load
    before = monitor.summary()
    start = time.perf_counter()
    call()
    seconds = time.perf_counter() - start
    after = monitor.summary()
    return {"first_call_s": round(seconds, 3),
            "compile_s": round(after["seconds"] - before["seconds"], 3),
            "cache_hits": after["cache_hits"] - before["cache_hits"],
            "cache_misses": after["cache_misses"] - before["cache_misses"]}


@contextlib.contextmanager
def _private_compile_cache(runtime: Runtime):
    """The runtime with an empty temporary compile cache (JAX's and Porter's traces),
    so the user's cache state does not matter; the configured one comes back after."""
    import tempfile

    import jax
    from jax._src import compilation_cache

    configured = jax.config.jax_compilation_cache_dir
    with tempfile.TemporaryDirectory(prefix="porter-bench-cache-") as private:
        try:
            compile_cache.enable(Path(private))
            compilation_cache.reset_cache()  # the cache object reads the directory once
            yield dataclasses.replace(runtime, cache=Path(private))
        finally:
            jax.config.update("jax_compilation_cache_dir", configured)
            compilation_cache.reset_cache()


def compile_cold_and_warm(call, monitor, traces) -> dict:
    """The first call with empty caches, then again with the caches it filled and
    nothing held in memory: what a first run and a second identical run pay."""
    cold = _first_call(call, monitor)
    if traces is not None:
        traces.forget()
    warm = _first_call(call, monitor)
    warm["traces_loaded"] = traces.loaded if traces is not None else 0
    ratio = warm["compile_s"] / cold["compile_s"] if cold["compile_s"] else None
    return {"cold": cold, "warm": warm,
            "warm_over_cold": None if ratio is None else round(ratio, 3)}


def _reference_device(platform: str) -> torch.device:
    """Where PyTorch eager runs: on the GPU when the port runs on one, else the host."""
    if platform == "gpu" and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def bench(recipe: Recipe, registry: Registry, steps: int = 5,
          torch_compile: bool = False) -> dict:
    """One step of the port beside PyTorch eager (and, with ``torch_compile``, beside
    the same model under ``torch.compile``); with a ``cache:`` section, also the
    recipe's denoise stage with the cache beside it without (``cache_compared``)."""
    result = _one_step(without_cache(recipe), registry, steps, torch_compile)
    if recipe.cache:
        result["cache"] = cache_compared(recipe)
    return result


def _one_step(recipe: Recipe, registry: Registry, steps: int,
              torch_compile: bool = False) -> dict:
    family = checks.checked_family(recipe, registry)
    beside.refuse_undescribed(family, "bench")
    started = runtime_mod.start(recipe)
    checks.check_platform(recipe, registry, started)
    loading.abstract.import_classes(family, recipe)  # before the patches, as a run's build
    compiles = monitor.compile_monitor()
    with _private_compile_cache(started) as runtime, \
            patches.applied(patches.selected(recipe, registry, family)):
        pipe = loading.load_pipeline(family, recipe)
        reference = copy.deepcopy(pipe.transformer).eval()
        config = pipe.transformer.config
        host = beside.cast(beside.random_inputs(family, recipe, config),
                           loading.dtypes.DTYPES[recipe.model.dtype])
        calling = beside.ported(pipe, recipe, registry, runtime)
        built = calling.ported
        traces = built.traces
        placed = {k: to_device(v, runtime) for k, v in host.items()}

        def ported():
            block(pipe.transformer(return_dict=False, **placed)[0])

        with active.transformer_calls(calling), runtime.env:
            compiled = compile_cold_and_warm(ported, compiles, traces)
            step = _median_seconds(ported, steps)

    device = _reference_device(runtime.platform)
    reference.to(device)
    inputs = {k: v.to(device) for k, v in host.items()}
    torch_step = _eager_step(reference, inputs, device, steps)
    peaks = memory.peak_memory(runtime.platform)
    if device.type == "cuda":
        peaks["torch_device_peak_bytes"] = int(torch.cuda.max_memory_allocated(device))
    compiled_peer = (torch_peer.compiled_step(reference, inputs, str(device), steps)
                     if torch_compile else None)

    estimates = family.estimates(recipe, config)
    batch = next(iter(host.values())).shape[0]
    flops = None
    if estimates:
        passes = estimates["attention"]["self"][0]
        flops = estimates["flops_per_step"] // passes * batch  # one call at this batch
    peak = matmul_peak(dtype="float32" if recipe.model.dtype == "float32" else "bfloat16")
    return {
        "recipe": recipe.name, "device": runtime.device_kind, "platform": runtime.platform,
        "devices": int(runtime.mesh.devices.size), "mesh": runtime.axes,
        "inputs": {k: list(v.shape) for k, v in host.items()},
        "tokens": estimates.get("tokens"),
        "compile": compiled,
        "step_s": {"porter": round(step, 5), "pytorch_eager": round(torch_step, 5),
                   "ratio": round(step / torch_step, 3)},
        "torch_compile": compiled_peer,
        "flops_per_step": flops,
        "achieved_flops_per_s": None if flops is None else flops / step,
        "matmul_peak_flops_per_s": peak,
        "fraction_of_matmul_peak": None if flops is None else round(flops / step / peak, 3),
        "memory": peaks,
        "reference_device": str(device),
        "torch_threads": torch.get_num_threads(),
        "quantize": _quantized(built.checkpoint.get("quantize"), runtime.platform),
    }


def _eager_step(reference, inputs: dict, device, steps: int) -> float:
    """The median seconds of a step of PyTorch eager, after a warm-up call."""
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def eager():
        reference(return_dict=False, **inputs)
        synchronize()  # CUDA runs asynchronously: time the work, not the launch

    with torch.no_grad():
        eager()  # warm-up (allocations, kernels)
        return _median_seconds(eager, steps)


def _quantized(record: dict | None, platform: str) -> dict | None:
    """What the recipe's quantize section did to the step timed, and what that time
    means on this platform (the eager reference beside it is never quantized)."""
    if record is None:
        return None
    layers = sum(record["layers"].values())  # component -> layers quantized
    meaning = ("this CPU's own timing: XLA:CPU runs the 8-bit dots in its own loops "
               "(int8 in integers, fp8 widened), so the ratio is no forecast of a TPU's "
               "or GPU's; the CPU measures fidelity (porter verify)"
               if platform == "cpu" else
               "the chip's 8-bit matmuls against PyTorch eager in the model's dtype")
    return {"format": record["format"], "layers": layers, "meaning": meaning}


def _compile_line(label: str, measured: dict) -> str:
    return (f"  compile, {label}: {measured['compile_s']:.2f} s (first call "
            f"{measured['first_call_s']:.2f} s; cache {measured['cache_hits']} hits, "
            f"{measured['cache_misses']} misses)")


def render(result: dict) -> str:
    step, comp = result["step_s"], result["compile"]
    lines = [f"bench {result['recipe']} on {result['devices']} {result['device']} "
             f"device(s), inputs {result['inputs']}",
             _compile_line("cold cache", comp["cold"]),
             _compile_line("warm cache", comp["warm"]) + (
                 f" = {comp['warm_over_cold']:.0%} of cold" if comp["warm_over_cold"] else ""),
             f"  step: porter {step['porter'] * 1e3:.1f} ms, PyTorch eager "
             f"{step['pytorch_eager'] * 1e3:.1f} ms, ratio {step['ratio']:.2f}x"]
    peer = result.get("torch_compile")
    if peer and "error" in peer:
        lines.append(f"  PyTorch under torch.compile: failed ({peer['error']})")
    elif peer:
        lines.append(f"  PyTorch under torch.compile: {peer['step_s'] * 1e3:.1f} ms a step "
                     f"(first call, compiling: {peer['first_call_s']:.1f} s); porter's "
                     f"ratio to it {step['porter'] / peer['step_s']:.2f}x")
    if result["flops_per_step"]:
        lines.append(f"  {result['flops_per_step'] / 1e9:.1f} GFLOP per step, "
                     f"{result['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s = "
                     f"{result['fraction_of_matmul_peak']:.0%} of a measured matmul peak "
                     f"({result['matmul_peak_flops_per_s'] / 1e9:.1f} GFLOP/s)")
    if result.get("quantize"):
        q = result["quantize"]
        lines.append(f"  quantized: {q['format']} in {q['layers']} linear layers "
                     f"(PyTorch eager runs unquantized); {q['meaning']}")
    memory = result["memory"]
    for key, value in memory.items():
        lines.append(f"  {key.replace('_', ' ')}: {value / 2**30:.2f} GiB")
    if "cache" in result:
        lines.append(render_cache(result["cache"]))
    return "\n".join(lines)


# ---------------------------------------------------------------- with a step cache
# A recipe's step cache against the same recipe without it: the denoise stage's
# wall time, the transformer blocks computed, and how far the latents moved.
#
# Each side loads its own port (the uncached one compiled whole, as a run without
# ``cache:`` is). Compiling is counted on neither side: a family whose steps Porter
# drives is timed over its steps after the first (which compiles); a pipeline's own
# loop runs twice and the second, warm, call is timed.

def _denoised(recipe: Recipe):
    """(final latents, denoise seconds without compiling, cache summary or None)."""
    with api.load(recipe) as port:
        outcome = port.run(Call(recipe, ("encode", "denoise")))
        if "steps_s" not in outcome.timings:  # the pipeline's own loop: no step timings
            outcome = port.run(Call(recipe))  # the first call compiled; time a warm one
    timings = outcome.timings
    seconds = sum(timings["steps_s"][1:]) if "steps_s" in timings else timings["generate_s"]
    return outcome.latents, seconds, timings.get("cache")


def cache_compared(recipe: Recipe) -> dict:
    """Denoise with and without the recipe's cache; what changed."""
    plain, plain_s, _ = _denoised(without_cache(recipe))
    cached, cached_s, summary = _denoised(recipe)
    difference = (cached.float() - plain.float())
    return {
        "method": summary["method"], "steps": recipe.generate.steps,
        "denoise_s": {"uncached": round(plain_s, 4), "cached": round(cached_s, 4),
                      "ratio": round(cached_s / plain_s, 3)},
        "speedup": round(plain_s / cached_s, 3),
        "blocks_computed": summary["blocks_computed"], "blocks_total": summary["blocks_total"],
        "skipped_steps": summary["skipped_steps"],
        "latents_max_abs_diff": float(difference.abs().max()),
        "latents_relative_l2": float(difference.norm() / plain.float().norm()),
    }


def render_cache(result: dict) -> str:
    seconds = result["denoise_s"]
    return (f"  cache {result['method']}: denoise {seconds['cached']:.2f} s vs "
            f"{seconds['uncached']:.2f} s uncached ({result['speedup']:.2f}x), blocks "
            f"computed {result['blocks_computed']} of {result['blocks_total']}, latents "
            f"moved {result['latents_relative_l2']:.2e} (relative L2; max |diff| "
            f"{result['latents_max_abs_diff']:.2e}); skipped steps "
            f"{result['skipped_steps']}")
