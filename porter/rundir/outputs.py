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
from typing import TYPE_CHECKING

from porter.errors import UsageError, environment_problem
from porter.runtime import atomic

if TYPE_CHECKING:
    from porter.recipe import Recipe


def output_dir(recipe: Recipe) -> Path:
    """The recipe's run directory: ``output.dir``, or outputs/<recipe name>."""
    return Path(recipe.output.dir or Path("outputs") / recipe.name)


LOCK = ".porter.lock"
RECORD, VIDEO = "run.json", "video.mp4"
STREAM = "stream.mp4"  # the frames as they are decoded (porter.generate.streaming)
PREVIEW = "preview.png"  # the latest live preview (porter.generate.preview)
FRAMES_DIR, FRAMES_NPY, LATENTS = "frames", "frames.npy", "latents.safetensors"
WAV = "audio.wav"  # the sound, losslessly (output.wav)


def prepare(directory: Path) -> None:
    """Create ``directory`` and prove a file can be written there, before any weight
    is loaded (finding out after minutes of loading and compiling wastes them)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        atomic.probe(directory)
    except OSError as exc:  # whatever the system says (/proc/x: no such file), it is
        # the path's problem, not Porter's
        problem = environment_problem(exc, "cannot write the output directory", directory)
        if problem.hint is None:
            problem.hint = "give output.dir a folder that can be created and written"
        raise problem from None


class Busy(UsageError):
    """Another run holds the directory."""


#: the directories this process holds (resolved): a batch holds its folder while its
#: items, inside it, are owned one by one; a server its folder while its jobs run
_HELD: set[Path] = set()
#: tries of a lock another process may be probing (``holder``'s shared lock) at once
_TRIES = 5
WAIT = "wait for it to finish, or give this run another output.dir"


def holder(directory: Path) -> str | None:
    """Who holds ``directory``'s lock, when another process does (what it wrote: the
    command, its pid, host and since when); None when it is free, unreadable, or
    this process holds it."""
    import fcntl

    import stat

    try:
        if Path(directory).resolve() in _HELD:
            return None
        # never blocks (a FIFO in its place), never follows a link
        fd = os.open(Path(directory) / LOCK, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:  # no lock file, or a folder this process cannot search
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:  # a shared lock is refused only while a run holds the exclusive one
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _written(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _written(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"


def _held_above(directory: Path) -> tuple[Path, str] | None:
    """The nearest folder above ``directory`` that another process holds, and who; up
    to the first folder anyone may write to (``/tmp``: a lock file there is anyone's,
    not a run's)."""
    import stat

    try:
        above = Path(directory).resolve().parents
    except OSError:
        return None
    for folder in above:
        try:
            if folder.stat().st_mode & stat.S_ISVTX:  # sticky: a shared scratch folder
                return None
        except OSError:  # not made yet (the run makes it), or not ours to look in
            continue
        found = holder(folder)
        if found is not None:
            return folder, found
    return None


@contextlib.contextmanager
def owned(directory: Path, what: str = "porter run"):
    """Hold the directory's lock for the block (its file says ``what`` holds it: the
    command); Busy if another process holds it, or holds a folder it is in (a batch's
    item folder belongs to the batch until the batch ends, a server's job folder to
    the server: a run there would replace a video they have recorded)."""
    import fcntl

    above = _held_above(directory)
    if above is not None:
        raise Busy(f"{directory} is inside {above[0]}, in use by {above[1]}", hint=WAIT)
    prepare(directory)
    path = directory / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # less the umask
    try:
        for attempt in range(_TRIES):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:  # held, or probed for a moment (``holder``)
                if attempt == _TRIES - 1:
                    raise Busy(f"{directory} is in use by {_written(fd)}",
                               hint=WAIT) from None
                time.sleep(0.01)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{what}, pid {os.getpid()} on {socket.gethostname()}, since "
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
