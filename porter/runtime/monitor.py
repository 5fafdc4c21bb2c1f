"""Compile work JAX reports (tracing, lowering, compiling, cache hits and misses),
summed for the run record."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class CompileMonitor:
    """Compile work JAX reports through jax.monitoring, summed per event."""

    seconds: Counter = field(default_factory=Counter)
    events: Counter = field(default_factory=Counter)
    programs: int = 0  # programs JAX built (traced to MLIR), eager ops' included

    def on_duration(self, event: str, duration: float, **_) -> None:
        if event.startswith(("/jax/core/compile", "/jax/compilation_cache")):
            self.seconds[event.rsplit("/", 1)[-1]] += duration
        if event.endswith("jaxpr_to_mlir_module_duration"):
            self.programs += 1

    def on_event(self, event: str, **_) -> None:
        if event.startswith("/jax/compilation_cache"):
            self.events[event.rsplit("/", 1)[-1]] += 1

    def total_seconds(self) -> float:
        keys = ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration",
                "backend_compile_duration", "cache_retrieval_time_sec")
        return sum(self.seconds[k] for k in keys)

    def summary(self) -> dict:
        """The totals, and the seconds split: tracing to a jaxpr, lowering it to MLIR,
        the backend's compile, and reading compiled programs from the cache."""
        return {"seconds": round(self.total_seconds(), 4), "programs": self.programs,
                "cache_hits": self.events["cache_hits"],
                "cache_misses": self.events["cache_misses"],
                **{name: round(self.seconds[key], 4) for name, key in SPLIT.items()}}


#: the summary's split of compile seconds -> the jax.monitoring duration it sums
SPLIT = {"trace_s": "jaxpr_trace_duration", "lower_s": "jaxpr_to_mlir_module_duration",
         "backend_s": "backend_compile_duration", "cache_load_s": "cache_retrieval_time_sec"}


def process_seconds() -> float | None:
    """Seconds since this process started (the interpreter's start, before any import),
    from the kernel's record of it; None where there is none (not Linux)."""
    import os

    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            # the command name (field 2) may hold spaces: count fields after its ")"
            started = int(stat.read().rsplit(")", 1)[1].split()[19])
            age = float(uptime.read().split()[0]) - started / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    # a container may show its own uptime beside the host's start times: no answer
    return round(age, 2) if age >= 0 else None


_monitor: CompileMonitor | None = None


def compile_monitor() -> CompileMonitor:
    """One process-wide monitor (jax.monitoring listeners cannot be removed)."""
    global _monitor
    if _monitor is None:
        import jax.monitoring
        _monitor = CompileMonitor()
        jax.monitoring.register_event_duration_secs_listener(_monitor.on_duration)
        jax.monitoring.register_event_listener(_monitor.on_event)
    return _monitor
