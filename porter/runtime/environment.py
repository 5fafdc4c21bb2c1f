"""What JAX reads once, when it starts: the platform, the number of virtual CPU
devices, libtpu's settings; and how freed host memory goes back to the system. Set
before anything asks JAX for devices (``porter.runtime.configure``)."""

from __future__ import annotations

import os
import sys

from porter.errors import UsageError

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def backends_started() -> bool:
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
    if backends_started():
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


def request_platform(platform: str) -> None:
    """Have JAX run on ``platform`` (cpu, gpu, tpu). JAX reads JAX_PLATFORMS when it is
    imported: where it already was (Python code that imported it before Porter), its
    config takes the setting too, or a recipe's ``runtime.platform: cpu`` ran on the GPU
    (seen on an H200 through the Python API). Once JAX has started on another platform,
    refused: a process has one."""
    name = {"gpu": "cuda"}.get(platform, platform)
    if not backends_started():
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


#: libtpu lowers a program's operations on fibers, each with a stack of its own, and
#: their default stack is too small for some programs: for TPU7x (v7x) the lowering of
#: UMT5-XXL's encoder (the text encoder of Wan and of the pipelines built on it) ended
#: the process with "SIGSEGV STACK OVERFLOW" in the convolution emitter's cost model
#: (libtpu 0.0.42.1; two of its 24 layers suffice), where 256 KiB was enough. 8 MiB,
#: a thread's usual stack: the peak memory of that compile did not change (2.0 GB).
FIBER_STACK_FLAG = "fibers_default_thread_stack_size"
FIBER_STACK_BYTES = 8 << 20


def libtpu_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("libtpu") is not None


def roomy_libtpu_stacks() -> None:
    """Give libtpu's fibers a stack its lowering does not overflow: it reads
    LIBTPU_INIT_ARGS once, when it starts. Left as it is where the environment sets a
    stack itself, where libtpu has started already (the setting would change nothing
    but JAX's compile cache keys, which hash it), and where there is no libtpu. libtpu
    ends a process on a flag it does not know: the libtpu Porter's `tpu` extra pins knows it."""
    given = os.environ.get("LIBTPU_INIT_ARGS", "")
    named = {f.lstrip("-").split("=", 1)[0] for f in given.split()}
    if FIBER_STACK_FLAG in named or not libtpu_installed() or _libtpu_started():
        return
    os.environ["LIBTPU_INIT_ARGS"] = f"{given} --{FIBER_STACK_FLAG}={FIBER_STACK_BYTES}".strip()


def _libtpu_started() -> bool:
    """Has this process started libtpu (a TPU backend, or a topology to compile for)?"""
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src.lib import xla_client

        return xla_client.pjrt_plugin_initialized("tpu")
    except (ImportError, AttributeError, RuntimeError):  # not loaded (or no helper)
        return False


def tpu_attached() -> bool:
    """Does this machine have TPU chips (as JAX finds them: on its PCI bus)? Where libtpu
    is installed (``porter compile`` needs it) but no TPU is, JAX still starts libtpu,
    which logs errors unless told there is nothing to find."""
    if not libtpu_installed():
        return True  # nothing to quiet
    try:
        from jax._src import hardware_utils

        return hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0
    except (ImportError, AttributeError, OSError):
        return True  # cannot tell: leave libtpu as it is
