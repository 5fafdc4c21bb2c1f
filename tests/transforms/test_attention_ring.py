"""Ring attention over the mesh's sequence axis: equal to attention on one device for
any head count and any block sizes, the key/value shares passed between devices
(collective permutes), never gathered; chosen where Ulysses cannot split the heads."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from porter.transforms.attention import kernels, sharded

# float32 on CPU; the ring sums in another order than reference
TOLERANCE = 2e-5


def mesh(**axes):
    devices = np.array(jax.devices()[: int(np.prod(list(axes.values())))])
    return jax.sharding.Mesh(devices.reshape(tuple(axes.values())), tuple(axes))


def qkv(batch, heads, length, dim=16):
    keys = jax.random.split(jax.random.key(1), 3)
    return tuple(jax.random.normal(key, (batch, heads, length, dim)) for key in keys)


def ringed(m, q, k, v, rings=None, block=32, keep=None):
    return jax.jit(lambda q, k, v: sharded.run(
        kernels.blockwise, m, q, k, v, keep, data_axis="dp", head_axis="sp",
        sequence_axis="sp", rings=rings, scale=0.25, block_q=block, block_kv=block))(q, k, v)


@pytest.mark.parametrize("axes,heads,length,block", [
    ({"sp": 8}, 3, 256, 32),            # 3 heads on 8: no Ulysses
    ({"sp": 8}, 5, 200, 16),            # 25 tokens a device: blocks padded
    ({"dp": 2, "sp": 4}, 3, 96, 64),    # the batch over dp beside it
])
def test_ring_equals_one_device(axes, heads, length, block):
    q, k, v = qkv(2, heads, length)
    got = ringed(mesh(**axes), q, k, v, block=block)
    assert float(jnp.abs(got - kernels.reference(q, k, v, scale=0.25)).max()) <= TOLERANCE


def test_the_shares_go_round_and_are_never_gathered():
    m = mesh(sp=8)
    q, k, v = qkv(1, 3, 256)
    text = jax.jit(lambda q, k, v: sharded.run(
        kernels.blockwise, m, q, k, v, None, data_axis="dp", head_axis="sp",
        sequence_axis="sp", scale=0.25, block_q=32, block_kv=32)).lower(q, k, v) \
        .compile().as_text()
    assert "collective-permute" in text and "all-gather" not in text


def test_ring_where_asked_ulysses_or_gather_otherwise():
    m = mesh(sp=8)
    q, k, v = qkv(1, 8, 64)
    three = qkv(1, 3, 64)[0]

    def rings(asked, q=q, k=k, keep=None):
        axes = sharded.layout(m, q.shape, "dp", "sp")
        return sharded._rings(asked, m, q, k, keep, "sp", axes[1], axes[2])

    assert not rings(None) and rings(True)  # 8 heads: Ulysses, unless the ring is asked
    assert rings(None, three, three) and not rings(False, three, three)  # else gathered
    assert not rings(True, k=k[:, :, :16])  # cross-attention: the keys are whole
    assert not rings(True, keep=jnp.ones((1, 1, 1, 64), bool))  # a mask: the kernel's
    expected = kernels.reference(q, k, v, scale=0.25)
    for asked in (True, False):
        assert float(jnp.abs(ringed(m, q, k, v, asked) - expected).max()) <= TOLERANCE
