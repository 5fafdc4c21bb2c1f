"""Stored traced programs: a damaged, swapped or failing entry is never run, and an
unwritable store costs a warning, not the run."""

import pytest

pytestmark = pytest.mark.slow


def _trace_cache(directory):
    from porter.transforms.jit.traces import TraceCache
    return TraceCache(directory, "fingerprint")


def _stored(directory):
    import jax.numpy as jnp

    cache = _trace_cache(directory)
    f = cache.jit("double", lambda x: x * 2)
    g = cache.jit("square", lambda x: x * x)
    f(jnp.arange(4.0)), g(jnp.arange(3.0))
    assert cache.exported == 2
    return sorted(directory.glob("*.exported"))


def test_a_damaged_stored_program_is_discarded_and_traced_again(tmp_path, monkeypatch):
    import jax.numpy as jnp

    from porter.runtime import notices
    monkeypatch.setattr(notices, "_given", [])
    for path in _stored(tmp_path):
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01  # one flipped bit in the program
        path.write_bytes(bytes(data))
    cache = _trace_cache(tmp_path)
    assert cache.jit("double", lambda x: x * 2)(jnp.arange(4.0)).tolist() == [0, 2, 4, 6]
    assert (cache.loaded, cache.discarded, cache.exported) == (0, 1, 1)
    assert [w for w in notices.given() if "discarded a stored traced program" in w]
    again = _trace_cache(tmp_path)  # the new entry is good
    again.jit("double", lambda x: x * 2)(jnp.arange(4.0))
    assert (again.loaded, again.discarded) == (1, 0)


def test_swapped_stored_programs_are_never_run(tmp_path):
    import jax.numpy as jnp

    first, second = _stored(tmp_path)
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)
    cache = _trace_cache(tmp_path)
    assert cache.jit("double", lambda x: x * 2)(jnp.arange(4.0)).tolist() == [0, 2, 4, 6]
    assert cache.jit("square", lambda x: x * x)(jnp.arange(3.0)).tolist() == [0, 1, 4]
    assert (cache.loaded, cache.discarded) == (0, 2)


def test_a_stored_program_whose_first_call_fails_is_a_miss(tmp_path):
    """An intact entry that still fails (here: another program stored under this key,
    with a matching digest) is discarded and traced again."""
    import jax.numpy as jnp

    from porter.transforms.jit import traces as trace_cache
    first, second = _stored(tmp_path)
    key_second = second.stem
    blob_first = trace_cache._unpack(first.stem, first.read_bytes())
    second.write_bytes(trace_cache._pack(key_second, blob_first))  # 4-vector program
    cache = _trace_cache(tmp_path)
    square = cache.jit("square", lambda x: x * x)
    assert square(jnp.arange(3.0)).tolist() == [0, 1, 4]
    assert cache.discarded == 1


def test_an_unwritable_trace_cache_warns_once_and_the_run_goes_on(tmp_path, monkeypatch):
    import jax.numpy as jnp

    from porter.runtime import notices
    monkeypatch.setattr(notices, "_given", [])
    (tmp_path / "file").write_text("not a directory")
    cache = _trace_cache(tmp_path / "file" / "traces")
    assert cache.jit("double", lambda x: x * 2)(jnp.arange(4.0)).tolist() == [0, 2, 4, 6]
    assert cache.jit("square", lambda x: x * x)(jnp.arange(3.0)).tolist() == [0, 1, 4]
    assert len([w for w in notices.given() if "cannot be stored" in w]) == 1
