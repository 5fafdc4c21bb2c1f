"""JAX's persistent compile cache, made safe to keep across runs.

The cache is optional: it saves compile time, never changes a result. So a
cache that cannot be used must cost a warning, never a run:

- before a run uses it, the directory is created and a file written there; if
  that fails (no space, read-only, a file in the way) the run warns once and
  goes on without a cache (``usable``);
- JAX writes an entry in place (``write_bytes``): a full disk or a killed run
  leaves a 0-byte or cut entry that JAX then fails to read on every later run
  and never replaces, so every later run silently recompiles. Here each entry is
  written to a temporary name and renamed, a failed write leaves nothing and
  turns writing off for the run (one warning), and an entry JAX cannot read is
  deleted (one warning), so the next compile stores a good one;
- JAX trusts a file's name: an entry stored under another key (files swapped or
  copied over each other) is loaded and either fails to compile its call
  (``safe_zip()``, exit 1 on every run) or, when the two programs take the same
  arguments, silently runs the other program. So each entry Porter writes ends
  with a seal naming its key and its digest (``_seal``), and an entry whose seal
  does not match its key and bytes is deleted (one warning) and compiled again.

The hooks wrap two functions of ``jax._src.compilation_cache`` that JAX's
compiler calls through the module; if a JAX release moves them, ``guard`` does
nothing and JAX's own behaviour stays.
"""

from __future__ import annotations

import os
from pathlib import Path

from porter.runtime import atomic, notices

_state = {"writes": True, "guarded": False}


def default_directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "porter" / "jax-compile"


def porter_home(name: str) -> Path:
    """Where Porter keeps ``name`` (layouts, sketches) beside its compiled programs:
    under ``PORTER_CACHE_DIR`` when set, else ``~/.cache/porter``."""
    explicit = os.environ.get("PORTER_CACHE_DIR")
    return (Path(explicit) if explicit else default_directory().parent) / name


def directory(setting: bool | str) -> Path | None:
    """The compile-cache directory a recipe asks for; ``PORTER_CACHE_DIR`` wins."""
    if os.environ.get("PORTER_CACHE_DIR"):
        return Path(os.environ["PORTER_CACHE_DIR"])
    if setting is False:
        return None
    return default_directory() if setting is True else Path(setting).expanduser()


def enable(directory: Path | None) -> Path | None:
    """Turn on JAX's persistent cache in ``directory``; returns the directory in use
    (None: no cache, also when the directory cannot be written: a warning, not an
    error, since the cache only saves time)."""
    import jax

    if directory is None or not usable(directory):
        return None
    guard()
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


def usable(directory: Path) -> bool:
    """Can the compile cache live in ``directory``? Warns once when it cannot."""

    try:
        directory.mkdir(parents=True, exist_ok=True)
        atomic.probe(directory)
    except OSError as exc:
        _warn_unwritable(directory, exc)
        return False
    _remove_stale_partials(directory)
    return True


def _remove_stale_partials(directory: Path, age_s: float = 3600) -> None:
    """Temporary entries of killed writers (a live writer's are younger)."""
    import time

    for partial in directory.glob(".*.partial"):
        try:
            if time.time() - partial.stat().st_mtime > age_s:
                partial.unlink()
        except OSError:
            pass


def _warn_unwritable(where, exc: OSError) -> None:
    reason = exc.strerror or str(exc)
    notices.warn(f"the compile cache at {where} cannot be written ({reason}); "
                 "continuing without it (every run compiles from scratch)",
                 hint="free space there, fix its permissions, or set PORTER_CACHE_DIR "
                      "(or runtime.compile_cache) to a writable directory")


def guard() -> None:
    """Wrap JAX's cache reads and writes as the module docstring says (once)."""
    if _state["guarded"]:
        return
    try:
        from jax._src import compilation_cache as cc
        from jax._src import lru_cache
        read, write = cc.get_executable_and_time, cc.put_executable_and_time
        suffix = lru_cache._CACHE_SUFFIX
    except (ImportError, AttributeError):
        return

    def entry(backend, key: str) -> Path | None:
        cache = cc._get_cache(backend)
        path = getattr(cache, "path", None)
        return None if path is None else Path(str(path)) / f"{key}{suffix}"

    def get_executable_and_time(cache_key, compile_options, backend, *args, **kwargs):
        _prepare(cc._get_cache(backend), suffix)
        try:
            return read(cache_key, compile_options, backend, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a damaged entry, whatever JAX raised
            path = entry(backend, cache_key)
            if path is not None:
                path.unlink(missing_ok=True)
            notices.warn(f"removed an unreadable compile cache entry ({path}: "
                         f"{type(exc).__name__}); it is compiled again and stored anew")
            return None, None

    def put_executable_and_time(cache_key, module_name, executable, backend, *args,
                                **kwargs):
        if not _state["writes"]:
            return
        _prepare(cc._get_cache(backend), suffix)
        try:
            write(cache_key, module_name, executable, backend, *args, **kwargs)
        except OSError as exc:
            path = entry(backend, cache_key)
            if path is not None:
                path.unlink(missing_ok=True)
            _state["writes"] = False
            _warn_unwritable(path.parent if path else "?", exc)

    cc.get_executable_and_time = get_executable_and_time
    cc.put_executable_and_time = put_executable_and_time
    _state["guarded"] = True


def _prepare(cache, suffix: str) -> None:
    """Puts made atomic, then sealed (the seal wraps whichever ``put`` writes)."""
    _atomic_puts(cache)
    _sealed_entries(cache, suffix)


def _atomic_puts(cache) -> None:
    """Entries written whole or not at all (JAX's own ``put`` writes in place).
    Only for a cache without eviction (Porter's default): eviction keeps its own
    bookkeeping under a lock, left as JAX does it."""
    if cache is None or getattr(cache, "_porter_atomic", False) \
            or getattr(cache, "eviction_enabled", True) or not hasattr(cache, "path"):
        return
    from jax._src import lru_cache

    def put(key: str, value: bytes) -> None:
        path = Path(str(cache.path)) / f"{key}{lru_cache._CACHE_SUFFIX}"
        if not path.exists():
            atomic.write_bytes(path, value)

    cache.put = put
    cache._porter_atomic = True


# The seal is a zstd skippable frame (magic 0x184D2A5E, then the payload's length),
# so JAX's own reader still decompresses a sealed entry whichever codec it uses
# (zlib ignores bytes after its stream; zstd skips such frames). Its payload: a
# version tag, SHA-256 of the key, SHA-256 of the entry's bytes (fixed length).
_SEAL_TAG = b"porter-entry-v1\n"
_SEAL_HEAD = (0x184D2A5E).to_bytes(4, "little") + (len(_SEAL_TAG) + 64).to_bytes(4, "little")
_SEAL_SIZE = len(_SEAL_HEAD) + len(_SEAL_TAG) + 64


def _seal(key: str, value: bytes) -> bytes:
    import hashlib

    return (_SEAL_HEAD + _SEAL_TAG + hashlib.sha256(key.encode()).digest()
            + hashlib.sha256(value).digest())


def _unseal(key: str, data: bytes) -> tuple[bytes | None, str]:
    """The entry stored under ``key`` in ``data``, or None and why it is refused."""
    import hashlib

    if not data:
        return None, "empty"
    value, seal = data[:-_SEAL_SIZE], data[-_SEAL_SIZE:]
    if len(data) < _SEAL_SIZE or not seal.startswith(_SEAL_HEAD + _SEAL_TAG):
        return None, "cut, or stored without its key and digest"
    if seal[-64:-32] != hashlib.sha256(key.encode()).digest():
        return None, "stored under another key"
    if seal[-32:] != hashlib.sha256(value).digest():
        return None, "its digest does not match"
    return value, ""


def _sealed_entries(cache, suffix: str) -> None:
    """Entries written with their seal and read only when it matches (once per cache
    object; JAX makes a new one when its cache is reset)."""
    if cache is None or getattr(cache, "_porter_sealed", False) or not hasattr(cache, "path"):
        return
    get, put = cache.get, cache.put

    def sealed_get(key: str) -> bytes | None:
        data = get(key)
        if data is None:
            return None
        value, why = _unseal(key, data)
        if value is None:  # a miss: JAX compiles it and ``put`` stores it anew
            path = Path(str(cache.path)) / f"{key}{suffix}"
            try:
                path.unlink(missing_ok=True)
            except OSError:
                pass
            _warn_removed(path, why)
        return value

    cache.get = sealed_get
    cache.put = lambda key, value: put(key, bytes(value) + _seal(key, bytes(value)))
    cache._porter_sealed = True


def _warn_removed(path: Path, why: str) -> None:
    if why.startswith(("empty", "cut")):  # one warning for a cache of an older Porter
        notices.warn(f"removed an unreadable compile cache entry in {path.parent} ({why}); "
                     "such entries are compiled again and stored anew")
    else:
        notices.warn(f"removed a compile cache entry that is not its key's ({path}: {why}); "
                     "it is compiled again and stored anew")
