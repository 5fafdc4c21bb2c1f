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
  deleted (one warning), so the next compile stores a good one.

The hooks wrap two functions of ``jax._src.compilation_cache`` that JAX's
compiler calls through the module; if a JAX release moves them, ``guard`` does
nothing and JAX's own behaviour stays.
"""

from __future__ import annotations

from pathlib import Path

from porter import notices

_state = {"writes": True, "guarded": False}


def usable(directory: Path) -> bool:
    """Can the compile cache live in ``directory``? Warns once when it cannot."""
    from porter import outputs

    try:
        directory.mkdir(parents=True, exist_ok=True)
        outputs.probe(directory)
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
        _atomic_puts(cc._get_cache(backend))
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


def _atomic_puts(cache) -> None:
    """Entries written whole or not at all (JAX's own ``put`` writes in place).
    Only for a cache without eviction (Porter's default): eviction keeps its own
    bookkeeping under a lock, left as JAX does it."""
    if cache is None or getattr(cache, "_porter_atomic", False) \
            or getattr(cache, "eviction_enabled", True) or not hasattr(cache, "path"):
        return
    from jax._src import lru_cache

    from porter import outputs

    def put(key: str, value: bytes) -> None:
        path = Path(str(cache.path)) / f"{key}{lru_cache._CACHE_SUFFIX}"
        if not path.exists():
            outputs.write_bytes(path, value)

    cache.put = put
    cache._porter_atomic = True
