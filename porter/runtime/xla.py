"""The XLA compiler options a run passes to every program: the recipe's, checked, or
Porter's defaults for the platform."""

from __future__ import annotations

import functools

from porter.errors import UsageError

#: XLA compiler options Porter passes when a recipe sets none, per platform. On CPU:
#: - XLA's YNNPACK pass otherwise folds norms, modulation and GELU into the big
#:   matmuls at long sequences, and feeds them constants broadcast to full activation
#:   size: 0.8 s of a 15.6 s step of the 8k-token Wan block (benchmarks/README.md);
#: - XLA's concurrency-optimized scheduler starts every independent op early. A CPU
#:   has no bfloat16 matmul, so each bfloat16 weight is converted to float32 before
#:   its matmul, and that scheduler converts all of them at once: a real-size Wan
#:   1.3B step held 5.3 GiB of float32 weight copies (twice the weights) where the
#:   memory-minimizing scheduler holds one.
DEFAULT_XLA_OPTIONS = {
    "cpu": {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT",
            "xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"},
}


def options(setting: dict | None, platform: str, device=None) -> dict:
    """The compiler options for this run: the recipe's, checked, or the platform's
    defaults where this XLA knows them. Checked by the compiler of ``device`` (default:
    JAX's first device), the one the programs are compiled for."""
    if setting is None:  # each default this XLA knows (an older one lacks some)
        return {key: value for key, value in DEFAULT_XLA_OPTIONS.get(platform, {}).items()
                if _refusal(((key, value),), device) is None}
    options = dict(setting)
    refused = _refusal(tuple(sorted(options.items())), device) if options else None
    if refused is None:
        return options
    raise UsageError(f"runtime.xla_options: {refused}",
                     hint="names are XLA debug options of the installed jaxlib (xla_cpu_*, "
                          "xla_gpu_*, xla_tpu_*, ...); enum values take their full "
                          "upper-case names")


@functools.cache
def _refusal(options: tuple, device=None) -> str | None:
    """XLA's complaint about these options, from compiling a one-op program for
    ``device`` (once per process, before the compile cache is on, so no run counts it)."""
    import jax

    value = 0.0 if device is None else jax.ShapeDtypeStruct(
        (), "float32", sharding=jax.sharding.SingleDeviceSharding(device))
    try:
        jax.jit(lambda x: x, compiler_options=dict(options)).lower(value).compile()
    except Exception as exc:  # XLA names the option it refuses
        return str(exc).splitlines()[0]
    return None
