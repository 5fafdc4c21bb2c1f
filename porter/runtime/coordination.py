"""Small values every process of a multi-process run can read: the key-value store of
JAX's own coordination service (the one ``jax.distributed.initialize`` joins), not a
messaging layer of Porter's. Unlike a collective, reading a key can wait with a
timeout, and a process can look without the others taking part: what a server
needs to hand jobs to processes that wait for them, and to notice one that is gone.

Keys are Porter's own (``porter/...``); values are text.
"""

from __future__ import annotations

PREFIX = "porter/"


def _client():
    from jax._src import distributed as jax_distributed

    client = jax_distributed.global_state.client
    if client is None:
        raise RuntimeError("the multi-process runtime is not joined")
    return client


def put(key: str, value: str) -> None:
    """Set ``key`` (once: a key is never written twice)."""
    _client().key_value_set(PREFIX + key, value)


def count(key: str) -> int:
    """Add one to the counter ``key`` (0 before the first); its new value."""
    return int(_client().key_value_increment(PREFIX + key, 1))


def look(key: str) -> str | None:
    """``key``'s value now, or None where none is set."""
    try:
        return _client().key_value_try_get(PREFIX + key)
    except Exception as exc:  # the runtime raises its own error type for a missing key
        if "NOT_FOUND" in str(exc):
            return None
        raise


def wait(key: str, seconds: float) -> str | None:
    """``key``'s value once it is set, or None after ``seconds``."""
    try:
        return _client().blocking_key_value_get(PREFIX + key, max(1, int(seconds * 1000)))
    except Exception as exc:
        if "DEADLINE_EXCEEDED" in str(exc):
            return None
        raise


def departed(count: int) -> None:
    """Return once every other process of ``count`` has left the runtime
    (``distributed.leave``) or is gone: the service answers when every process still
    joined has asked."""
    _client().get_live_nodes(list(range(count)))
