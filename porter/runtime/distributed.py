"""Runs that span several processes, on JAX's own multi-controller runtime.

Every process runs the same program on its own devices; the mesh spans all
of them. Settings come from flags or the environment JAX users already set
(JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID); with
``auto`` JAX detects them itself (TPU pods, SLURM, Open MPI). Process 0 alone
writes files; values it writes are gathered from every process first, which
is a collective, so every process takes part in it.
"""

from __future__ import annotations

import os
import sys

from porter.errors import UsageError, first_line

COORDINATOR, PROCESSES, PROCESS_ID = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES",
                                      "JAX_PROCESS_ID")
AUTO = "PORTER_MULTI_PROCESS"  # "auto": let JAX detect the cluster


def request(coordinator: str | None = None, processes: int | None = None,
            process_id: int | None = None, auto: bool = False) -> None:
    """Record flag values where ``initialize`` (and child tools) will find them."""
    for key, value in ((COORDINATOR, coordinator), (PROCESSES, processes),
                       (PROCESS_ID, process_id)):
        if value is not None:
            os.environ[key] = str(value)
    if auto:
        os.environ[AUTO] = "auto"


def _settings() -> dict | None:
    """Explicit settings from the environment; {} for auto-detection; None: one process."""
    given = {key: os.environ.get(key) for key in (COORDINATOR, PROCESSES, PROCESS_ID)}
    if not any(given.values()):
        return {} if os.environ.get(AUTO) == "auto" else None
    missing = [key for key, value in given.items() if not value]
    if missing:
        raise UsageError(f"a multi-process run needs {', '.join(missing)} as well",
                         hint="give --coordinator HOST:PORT, --num-processes N and "
                              "--process-id I together (or --multi-process to let JAX "
                              "detect them on a TPU pod or SLURM)")
    try:
        processes, process_id = int(given[PROCESSES]), int(given[PROCESS_ID])
    except ValueError:
        raise UsageError(f"{PROCESSES} and {PROCESS_ID} must be integers, got "
                         f"{given[PROCESSES]!r} and {given[PROCESS_ID]!r}") from None
    if not 0 <= process_id < processes:
        raise UsageError(f"process id {process_id} is not in 0..{processes - 1}",
                         hint="number the processes 0 to N-1")
    return {"coordinator_address": given[COORDINATOR], "num_processes": processes,
            "process_id": process_id}


def initialize(recoverable: bool = False) -> None:
    """Join the other processes before JAX creates devices (no-op for one process).

    ``recoverable``: a process that dies does not end the others (JAX's default ends
    every process once one stops sending heartbeats); the caller notices the loss
    itself and ends cleanly, as ``porter serve`` does with a message for its clients."""
    settings = _settings()
    if settings is None:
        return
    import jax
    from jax._src import distributed as jax_distributed

    if jax_distributed.global_state.client is not None:
        return  # already joined (several runs in one process)
    # CPU devices of different processes talk over TCP through gloo (this setting
    # only concerns the CPU backend; accelerators use their own collectives).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if recoverable:
        jax.config.update("jax_enable_recoverability", True)
    try:
        jax.distributed.initialize(**settings)
    except (RuntimeError, ValueError) as exc:
        raise UsageError(f"cannot join the multi-process run: {first_line(exc)}",
                         hint="start every process with the same coordinator address and "
                              "process count, and distinct process ids") from None


def leave() -> None:
    """Leave the multi-process runtime now, while process 0, which hosts its
    coordination service, still runs: JAX ends a process whose leaving at exit finds
    the service gone (an abort). Process 0 waits for the others to have left
    (``coordination.departed``)."""
    import jax

    jax.distributed.shutdown()


_alone = False  # this process works on its own devices only (see ``work_alone``)


def work_alone() -> None:
    """From now on this process computes on its own devices only and writes its own
    files: a batch split between data-parallel replicas, one replica set per process.
    The multi-process runtime stays joined, but nothing Porter does waits on the
    other processes (no collectives), and the helpers below answer as for one process."""
    global _alone
    _alone = True


def alone() -> bool:
    return _alone


def _jax_started() -> bool:
    return "jax" in sys.modules


def _single() -> bool:
    """One process: JAX not imported, or no multi-process settings (then JAX need not
    be asked, which would start its backend)."""
    if not _jax_started():
        return True
    try:
        return _settings() is None
    except UsageError:
        return False  # incomplete settings: ask JAX (initialize reports them)


def process_index() -> int:
    if _single() or _alone:
        return 0
    import jax
    return jax.process_index()


def process_count() -> int:
    if _single() or _alone:
        return 1
    import jax
    return jax.process_count()


def anywhere(flag: bool) -> bool:
    """Is ``flag`` true on any process? A collective: with several processes every
    one must call it at the same point, so that all go on or all stop together."""
    if process_count() == 1:
        return flag
    import numpy as np
    from jax.experimental import multihost_utils
    return bool(np.max(multihost_utils.process_allgather(np.int32(bool(flag)))))


def writes() -> bool:
    """Does this process write the run's files? Only process 0 does."""
    return process_index() == 0


def label() -> str:
    """'' for one process; '[process 1/2] ' when several speak."""
    if _alone:
        import jax
        return f"[process {jax.process_index()}/{jax.process_count()}] "
    count = process_count()
    return f"[process {process_index()}/{count}] " if count > 1 else ""
