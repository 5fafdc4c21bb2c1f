"""Files written whole or not at all.

Every file Porter writes (run outputs, stage records, compile and trace cache entries)
is written to a temporary name unique to its writer and renamed into place, so no
reader sees half a file and no writer can rename another writer's file; a failed
write leaves nothing behind and names the file it was writing.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

from porter.errors import WriteFailed

#: the suffix of a file being written (left behind only by a killed writer)
PARTIAL = ".partial"


def temporary(path: Path) -> Path:
    """A name beside ``path`` that no other writer (process or thread) uses."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}{PARTIAL}")


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
