"""The run directory: owned by one run while it writes, every file written whole.

- A run holds an advisory lock (``flock``) on ``.porter.lock`` in its directory
  for as long as it runs. The kernel drops it when the process ends, however it
  ends, so a crashed or killed run never leaves it stuck; a second run into a
  busy directory is refused, naming the holder.
- Every file is written whole (``porter.runtime.atomic``).
- A run removes, before it writes anything, the outputs of an older run that its
  own would replace: the record first (``run.json``), so that no file of this run
  can ever sit beside a record of another run.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path

from porter.errors import UsageError, environment_problem, is_environment_error
from porter.runtime import atomic


def output_dir(recipe) -> Path:
    """The recipe's run directory: ``output.dir``, or outputs/<recipe name>."""
    return Path(recipe.output.dir or Path("outputs") / recipe.name)


LOCK = ".porter.lock"
RECORD, VIDEO = "run.json", "video.mp4"
FRAMES_DIR, FRAMES_NPY, LATENTS = "frames", "frames.npy", "latents.safetensors"


def prepare(directory: Path) -> None:
    """Create ``directory`` and prove a file can be written there, before any weight
    is loaded (finding out after minutes of loading and compiling wastes them)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        atomic.probe(directory)
    except OSError as exc:
        if is_environment_error(exc):
            raise environment_problem(exc, "cannot write the output directory",
                                      directory) from None
        raise


class Busy(UsageError):
    """Another run holds the directory."""


#: the directories this process holds (resolved): a batch holds its folder while its
#: items, inside it, are owned one by one
_HELD: set[Path] = set()


def holder(directory: Path) -> str | None:
    """Who holds ``directory``'s lock, when another process does (its pid, host and
    since when, as it wrote them); None when it is free or this process holds it."""
    import fcntl

    path = directory / LOCK
    if directory.resolve() in _HELD or not path.is_file():
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:  # a shared lock is refused only while a run holds the exclusive one
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def owned(directory: Path):
    """Hold the directory's lock for the block; Busy if another run holds it, or holds
    the directory it is in (a batch's item folder belongs to the batch until the batch
    ends: a run there would replace a video the batch has recorded)."""
    import fcntl

    parent = holder(directory.parent)
    if parent is not None:
        raise Busy(f"{directory} is inside {directory.parent}, which another porter run "
                   f"holds ({parent}); a batch's item folders belong to it until it ends",
                   hint="wait for that run to finish, or give this run another output.dir")
    prepare(directory)
    path = directory / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # less the umask
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder_ = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
            raise Busy(f"{directory} is in use by another porter run ({holder_})",
                       hint="wait for it to finish, or give this run another output.dir"
                       ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
        held = directory.resolve()
        _HELD.add(held)
        try:
            yield
        finally:
            _HELD.discard(held)
            os.ftruncate(fd, 0)  # the file stays: unlinking a locked file races
    finally:
        os.close(fd)  # closing drops the lock


def remove_partials(directory: Path) -> None:
    """Temporary files a killed writer left (only the lock holder may call this)."""
    for leftover in directory.glob(f".*{atomic.PARTIAL}"):
        leftover.unlink(missing_ok=True)
