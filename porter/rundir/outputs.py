"""The run directory: owned by one run while it writes, every file written whole.

- A run holds an advisory lock (``flock``) on ``.porter.lock`` in its directory
  for as long as it runs. The kernel drops it when the process ends, however it
  ends, so a crashed or killed run never leaves it stuck; a second run into a
  busy directory is refused, naming the holder.
- Every file is written to a temporary name unique to its writer and renamed
  into place, so no reader sees half a file and no writer can rename another
  writer's file.
- A run removes, before it writes anything, the outputs of an older run that its
  own would replace: the record first (``run.json``), so that no file of this run
  can ever sit beside a record of another run.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import socket
import time
from pathlib import Path

from porter.errors import UsageError, WriteFailed, environment_problem, is_environment_error


def output_dir(recipe) -> Path:
    """The recipe's run directory: ``output.dir``, or outputs/<recipe name>."""
    return Path(recipe.output.dir or Path("outputs") / recipe.name)

LOCK = ".porter.lock"
RECORD, VIDEO = "run.json", "video.mp4"
FRAMES_DIR, FRAMES_NPY, LATENTS = "frames", "frames.npy", "latents.safetensors"
_PARTIAL = ".partial"


def temporary(path: Path) -> Path:
    """A name beside ``path`` that no other writer (process or thread) uses."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}{_PARTIAL}")


def write_bytes(path: Path, data: bytes) -> str:
    """Write ``data`` to ``path`` atomically; returns its SHA-256. A failed write
    (disk full, ...) leaves no temporary file behind and raises ``WriteFailed``, an
    OSError naming ``path`` (not the temporary name; a full disk's write() names
    none)."""
    path = Path(path)
    partial = temporary(path)
    try:
        with open(partial, "wb") as f:
            f.write(data)
        os.replace(partial, path)
    except BaseException as exc:
        partial.unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, WriteFailed):
            raise WriteFailed(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise
    return hashlib.sha256(data).hexdigest()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def writable_problem(directory: Path) -> str | None:
    """Why ``directory`` cannot take a run's files (None if it can), without creating
    it: the nearest existing ancestor must be a directory this process can write."""
    directory = Path(directory).expanduser()
    probe = directory
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        return f"{probe} is a file, not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    if _read_only(probe):
        return f"{probe} is on a read-only filesystem"
    return None


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def probe(directory: Path) -> None:
    """Write and remove a file in ``directory`` (OSError if that cannot be done)."""
    path = temporary(directory / "probe")
    try:
        with open(path, "wb") as f:
            f.write(b"porter")
    finally:
        path.unlink(missing_ok=True)


def prepare(directory: Path) -> None:
    """Create ``directory`` and prove a file can be written there, before any weight
    is loaded (finding out after minutes of loading and compiling wastes them)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe(directory)
    except OSError as exc:
        if is_environment_error(exc):
            raise environment_problem(exc, "cannot write the output directory",
                                      directory) from None
        raise


class Busy(UsageError):
    """Another run holds the directory."""


@contextlib.contextmanager
def owned(directory: Path):
    """Hold the directory's lock for the block; Busy if another run holds it."""
    import fcntl

    prepare(directory)
    path = directory / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # less the umask
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
            raise Busy(f"{directory} is in use by another porter run ({holder})",
                       hint="wait for it to finish, or give this run another output.dir"
                       ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # the file stays: unlinking a locked file races
    finally:
        os.close(fd)  # closing drops the lock


def remove_partials(directory: Path) -> None:
    """Temporary files a killed writer left (only the lock holder may call this)."""
    for leftover in directory.glob(f".*{_PARTIAL}"):
        leftover.unlink(missing_ok=True)
