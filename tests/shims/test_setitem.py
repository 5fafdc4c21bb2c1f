"""core.setitem: indexed assignment as PyTorch does it (broadcasting, strided slices)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from porter.registry.builtin import SETITEM
from porter.shims.setitem import full_slices, strided_set

SHAPE = (3, 5, 8)


def _slice(size: int):
    bound = st.one_of(st.none(), st.integers(-size - 1, size + 1))
    return st.builds(slice, bound, bound, st.one_of(st.none(), st.integers(1, 4)))


KEYS = st.one_of(
    st.tuples(_slice(3), _slice(5), _slice(8)),
    st.tuples(st.just(Ellipsis), _slice(8)),
    st.tuples(_slice(3), st.just(Ellipsis), _slice(8)),
    _slice(3),
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(key=KEYS, scalar=st.booleans())
def test_same_result_as_numpy(key, scalar):
    x = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    target_shape = x[key].shape
    value = np.float32(-1.5) if scalar else -np.arange(
        np.prod(target_shape), dtype=np.float32).reshape(target_shape)
    expected = x.copy()
    expected[key] = value
    got = strided_set(jnp.asarray(x), key, jnp.asarray(value))
    if got is None:  # every step is 1: left to the scatter, which is fine there
        assert all((s.step or 1) == 1 for s in full_slices(key, 3))
        return
    np.testing.assert_array_equal(np.asarray(got), expected)


def test_no_scatter_in_the_compiled_program():
    def rotate(x, a, b):
        x = strided_set(x, (Ellipsis, slice(0, None, 2)), a)
        return strided_set(x, (Ellipsis, slice(1, None, 2)), b)

    args = (jnp.zeros((4, 6, 8)), jnp.ones((4, 6, 4)), jnp.full((4, 6, 4), 2.0))
    text = jax.jit(rotate).lower(*args).compile().as_text()
    assert not re.search(r"\bscatter\(", text)  # the op, not a name in metadata
    np.testing.assert_array_equal(np.asarray(jax.jit(rotate)(*args))[0, 0],
                                  [1, 2, 1, 2, 1, 2, 1, 2])


def test_no_interior_padding_in_the_program():
    """Strided writes are edge pads and a select: the TPU compiler emits interior
    padding of a lane dimension element by element (tests/aot/test_compiler.py measures it)."""
    def rotate(x, a, b):
        x = strided_set(x, (Ellipsis, slice(0, None, 2)), a)
        return strided_set(x, (slice(1, None, 3), Ellipsis, slice(1, 7, 2)), b[1::3, :, :3])

    args = (jnp.zeros((4, 6, 8)), jnp.ones((4, 6, 4)), jnp.full((4, 6, 4), 2.0))
    text = jax.jit(rotate).lower(*args).as_text()
    pads = re.findall(r"stablehlo.pad .* interior = \[([\d, ]*)\]", text)
    assert pads and all(set(p.replace(" ", "").split(",")) == {"0"} for p in pads)


def test_other_keys_are_left_to_torchax():
    x = jnp.zeros((4, 4))
    for key in [(1, slice(None, None, 2)), (jnp.array([0, 2]),), (None, slice(0, 2)),
                (slice(None, None, -1),), (slice(0, 4),), (Ellipsis, Ellipsis)]:
        assert strided_set(x, key, 1.0) is None


def test_patched_torchax_tensor_matches_torch():
    from porter.shims.compat import import_torchax
    torchax = import_torchax()
    env = torchax.default_env()
    a, b = torch.randn(2, 7, 3, 5), torch.randn(2, 7, 3, 5)
    expected = torch.empty(2, 7, 3, 10)
    expected[..., 0::2], expected[..., 1::2] = a, b
    expected[0, 1] = 7.0  # an integer key: torchax's own path
    with SETITEM.applied(), env:
        out = torch.empty(2, 7, 3, 10, device="jax")
        out[..., 0::2] = a.to("jax")
        out[..., 1::2] = b.to("jax")
        out[0, 1] = 7.0
        got = out.to("cpu")
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.int32])
def test_value_takes_the_target_dtype(dtype):
    got = strided_set(jnp.zeros(6, dtype), (slice(0, None, 2),), jnp.array([1.7, 2.2, 3.9]))
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got, np.float32),
                                  np.asarray(jnp.zeros(6, dtype).at[::2].set(
                                      jnp.array([1.7, 2.2, 3.9]).astype(dtype)), np.float32))


def _index(key, device):
    """``key`` with its tensors on ``device``."""
    parts = key if isinstance(key, tuple) else (key,)
    return tuple(k.to(device) if isinstance(k, torch.Tensor) else k for k in parts)


# (target shape, key, value shape): values PyTorch broadcasts after dropping their
# leading size-1 dimensions, which JAX's .at[key].set alone refuses
BROADCASTS = [
    ((4, 3, 2, 5), 1, (1, 3, 2, 5)),  # batch[i] = latent, as Allegro's VAE does
    ((4, 2, 3), slice(1, 3), (1, 1, 2, 3)),
    ((2, 6, 4), (Ellipsis, slice(0, None, 2)), (1, 1, 6, 2)),  # strided, pad + select
    ((5, 3), torch.tensor([0, 2, 4]), (1, 3)),  # an index tensor
    ((3, 4), (slice(None), 2), (1, 1, 3)),
    ((3, 4), torch.tensor([True, False, True]), (1, 4)),  # a boolean mask
    ((3, 4), 0, ()),  # a 0-d value
]


@pytest.mark.parametrize("shape,key,value_shape", BROADCASTS)
def test_assignment_broadcasts_as_torch_does(shape, key, value_shape):
    from porter.shims.compat import import_torchax
    torchax = import_torchax()
    env = torchax.default_env()
    x = torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(shape)
    value = -torch.arange(1, int(np.prod(value_shape)) + 1,
                          dtype=torch.float32).reshape(value_shape)
    expected = x.clone()
    expected[_index(key, "cpu")] = value
    with SETITEM.applied(), env:
        out = x.to("jax")
        out[_index(key, "jax")] = value.to("jax")
        got = out.to("cpu")
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_unpatched_torchax_refuses_the_broadcast():
    """What the patch is for: without it the first case fails (if torchax learns
    PyTorch's rule, this fails and the reshape can go)."""
    from porter.shims.compat import import_torchax
    torchax = import_torchax()
    env = torchax.default_env()
    with env, pytest.raises((ValueError, TypeError)):
        out = torch.zeros(4, 3, device="jax")
        out[1] = torch.ones(1, 3).to("jax")
