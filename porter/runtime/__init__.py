"""The JAX side of a run: platform, virtual devices, compile cache, mesh.

Order matters: ``configure`` sets environment flags that JAX reads once, when
it creates its devices, so it must run before anything asks JAX for devices; ``start`` imports jax and
torchax (through ``porter.shims.compat``) and builds the mesh.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from porter.runtime import distributed, memory
from porter.errors import UsageError

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "porter" / "jax-compile"


def cache_dir(setting: bool | str) -> Path | None:
    """The compile-cache directory a recipe asks for; ``PORTER_CACHE_DIR`` wins."""
    if os.environ.get("PORTER_CACHE_DIR"):
        return Path(os.environ["PORTER_CACHE_DIR"])
    if setting is False:
        return None
    return default_cache_dir() if setting is True else Path(setting).expanduser()


def _backends_started() -> bool:
    """Has JAX created its devices yet? (It reads XLA_FLAGS then, not at import.)"""
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge
        return xla_bridge.backends_are_initialized()
    except (ImportError, AttributeError):  # a JAX without this helper: assume started
        return True


def request_cpu_devices(count: int) -> None:
    """Ask XLA for ``count`` virtual CPU devices; only possible before JAX starts."""
    if _backends_started():
        import jax
        # the flag makes devices per process: compare with this process's own
        have = jax.local_device_count("cpu") if jax.default_backend() == "cpu" else None
        if have == count:
            return
        raise UsageError(f"{count} virtual CPU devices were asked for after JAX started",
                         hint="set runtime.cpu_devices (or --cpu-devices) before JAX creates "
                              "its devices; in tests, set XLA_FLAGS in the environment")
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith(DEVICE_COUNT_FLAG)]
    os.environ["XLA_FLAGS"] = " ".join(flags + [f"{DEVICE_COUNT_FLAG}={count}"])


def configure(platform: str, cpu_devices: int | None) -> None:
    """Set what JAX reads when it starts: platform and virtual CPU device count."""
    if platform != "auto":
        request_platform(platform)
    if cpu_devices:
        request_cpu_devices(cpu_devices)
    if not _tpu_attached():
        quiet_libtpu()
    return_freed_memory()


def request_platform(platform: str) -> None:
    """Have JAX run on ``platform`` (cpu, gpu, tpu). JAX reads JAX_PLATFORMS when it is
    imported: where it already was (Python code that imported it before Porter), its
    config takes the setting too, or a recipe's ``runtime.platform: cpu`` ran on the GPU
    (seen on an H200 through the Python API). Once JAX has started on another platform,
    refused: a process has one."""
    name = {"gpu": "cuda"}.get(platform, platform)
    if not _backends_started():
        os.environ["JAX_PLATFORMS"] = name
        if "jax" in sys.modules:
            import jax
            jax.config.update("jax_platforms", name)
        return
    import jax
    running = jax.default_backend()
    if running != platform:
        raise UsageError(f"runtime.platform {platform} was asked for after JAX started on "
                         f"{running}",
                         hint="one platform per process: run this recipe in a process of "
                              "its own, or leave runtime.platform at auto")


MMAP_THRESHOLD = 1 << 20


def return_freed_memory() -> None:
    """Large buffers freed go back to the system at once. glibc serves an allocation
    from its heap unless it is over a threshold that grows with every large block
    freed (up to 32 MiB); a heap block freed is kept for reuse. Porter frees many
    large blocks as it loads, fuses LoRA updates and stacks block weights (per-block
    arrays freed as their stack is made), so the heap grew to hold them all: a Wan
    1.3B run on one CPU device peaked at 6.45 GiB where its weights and stacks need
    4.1 GiB, and at 5.43 GiB with blocks over 1 MiB always mapped (measured). Only
    where the environment does not choose (MALLOC_MMAP_THRESHOLD_)."""
    import ctypes
    import ctypes.util

    if os.environ.get("MALLOC_MMAP_THRESHOLD_") or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD (glibc's malloc.h)
    except (OSError, AttributeError):  # another C library: its own policy
        pass


def quiet_libtpu() -> None:
    """libtpu asks the cloud metadata server for the TPU it runs on and logs an error
    when there is none (any machine but a TPU VM). These settings answer for it; they
    are only set where the environment does not already say (a real TPU VM does)."""
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    # no TPU is opened: other processes compiling for a TPU at once do not conflict
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def _tpu_attached() -> bool:
    """Does this machine have TPU chips (as JAX finds them: on its PCI bus)? Where libtpu
    is installed (``porter compile`` needs it) but no TPU is, JAX still starts libtpu,
    which logs errors unless told there is nothing to find."""
    import importlib.util

    if importlib.util.find_spec("libtpu") is None:
        return True  # nothing to quiet
    try:
        from jax._src import hardware_utils

        return hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0
    except (ImportError, AttributeError, OSError):
        return True  # cannot tell: leave libtpu as it is


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


def xla_options(setting: dict | None, platform: str, device=None) -> dict:
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


def resolve_mesh(axes: dict, device_count: int, given: bool = False,
                 target: str | None = None) -> dict[str, int]:
    """Fill an 'auto' axis and check the mesh fits ``device_count`` devices (that
    exist, that ``given`` by --devices, or the chips of the TPU slice ``target``)."""
    fixed = math.prod(size for size in axes.values() if size != "auto")
    if fixed > device_count:
        shape = " x ".join(f"{a}={s}" for a, s in axes.items())
        if target:
            have, more = f"{target} has {device_count} chips", (
                " or choose a larger target (v4 and v5p count two TensorCores a chip: a "
                "v5p-8 is 4 chips)")
        elif given:
            have, more = f"--devices gives {device_count}", f" or give --devices {fixed}"
        else:
            have, more = f"{device_count} exist", (
                f"; to check or plan for a machine with {fixed} devices from here, add "
                f"--devices {fixed}; to run on {fixed} virtual CPU devices, --cpu-devices "
                f"{fixed}")
        raise UsageError(f"mesh {shape} needs {fixed} devices but {have}",
                         hint="shrink the mesh (e.g. mesh.dp=1)" + more)
    resolved = {}
    for axis, size in axes.items():
        resolved[axis] = device_count // fixed if size == "auto" else size
    return resolved


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
        return {"seconds": round(self.total_seconds(), 4), "programs": self.programs,
                "cache_hits": self.events["cache_hits"],
                "cache_misses": self.events["cache_misses"]}


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


def enable_compile_cache(directory: Path | None) -> Path | None:
    """Turn on JAX's persistent cache in ``directory``; returns the directory in use
    (None: no cache, also when the directory cannot be written: a warning, not an
    error, since the cache only saves time)."""
    import jax

    from porter.runtime import compile_cache
    if directory is None or not compile_cache.usable(directory):
        return None
    compile_cache.guard()
    jax.config.update("jax_compilation_cache_dir", str(directory))
    # Cache every program, however small or quick: small ones add up on CPU.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if jax.default_backend() != "gpu":
        # JAX's default also points XLA's GPU autotune cache into the directory, which
        # writes the directory's path into every program's compile options, hence into
        # its cache key: a moved or copied cache then never hits (measured: 30 misses
        # of 30). Only a GPU compile reads that cache.
        jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
    return directory


@dataclass
class Runtime:
    env: object  # torchax.tensor.Environment
    mesh: object  # jax.sharding.Mesh
    platform: str
    device_kind: str
    cache: Path | None
    xla_options: dict = field(default_factory=dict)  # jax.jit compiler_options

    @property
    def axes(self) -> dict[str, int]:
        return dict(self.mesh.shape)

    def replicated(self):
        from jax.sharding import NamedSharding, PartitionSpec
        return NamedSharding(self.mesh, PartitionSpec())


def device_memory(mesh_devices: int) -> memory.Limit | None:
    """What one device of a ``mesh_devices`` mesh can hold, where known, and which
    limit says so: an accelerator's own limit; on CPU, what this process may use
    (``memory.host_limit``: the machine's, its cgroup's or its address-space limit)
    shared by the virtual devices it runs (each holds its own copy of what it holds)."""
    import jax

    device = jax.local_devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
        if not (stats and stats.get("bytes_limit")):
            return None
        return memory.Limit(int(stats["bytes_limit"]), f"the {device.device_kind}'s memory")
    host = memory.host_limit()
    shared = max(1, min(mesh_devices, jax.local_device_count()))
    if shared == 1:
        return host
    return memory.Limit(host.bytes // shared,
                        f"{host.source}, shared by {shared} virtual CPU devices")


def _own_peak_rss() -> int:
    """This process's peak resident memory. On Linux the kernel's high-water mark of
    this address space (VmHWM): ``ru_maxrss`` is kept across exec, so a process started
    by a large one (a test worker, a notebook) would report its parent's size."""
    import resource

    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB elsewhere
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def peak_memory(runtime) -> dict:
    """Peak memory so far: the host process's (what the kernel counts), and on an
    accelerator the first device's own peak."""
    import jax

    found = {"host_peak_rss_bytes": _own_peak_rss()}
    device = jax.local_devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if runtime.platform != "cpu" and stats:
        found["device_peak_bytes"] = int(stats.get("peak_bytes_in_use", 0))
    return found


def start(recipe) -> Runtime:
    """Import JAX and torchax, enable the compile cache, build the mesh."""
    configure(recipe.runtime.platform, recipe.runtime.cpu_devices)
    distributed.initialize()  # before JAX creates devices: the mesh spans every process
    from porter.shims.compat import import_torchax
    torchax = import_torchax()
    import jax
    import numpy as np

    platform = jax.default_backend()
    options = xla_options(recipe.runtime.xla_options, platform)
    directory = enable_compile_cache(cache_dir(recipe.runtime.compile_cache))
    compile_monitor()
    # a process working alone (a batch split between replicas) meshes its own devices
    devices = jax.local_devices() if distributed.alone() else jax.devices()
    axes = resolve_mesh(recipe.mesh, len(devices))
    used = np.array(devices[: math.prod(axes.values())]).reshape(tuple(axes.values()))
    mesh = jax.sharding.Mesh(used, tuple(axes))
    return Runtime(env=torchax.default_env(), mesh=mesh, platform=platform,
                   device_kind=devices[0].device_kind, cache=directory,
                   xla_options=options)
