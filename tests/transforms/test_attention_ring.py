"""Ring attention over the mesh's token axes (``ring``, and ``sp`` where the heads do
not divide it), alone or beside heads over ``sp`` (2-D) or ``tp``: equal to attention
on one device for any head count and block size, the key/value shares passed between
devices (collective permutes), never gathered."""

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


def attended(m, head_axis="sp", block=32):
    """``sharded.run`` on mesh ``m``, the tokens over its ring and sp axes (as
    ``sharding.token_axes`` orders them), compiled."""
    tokens = tuple(axis for axis in ("ring", "sp") if axis in m.shape)
    return jax.jit(lambda q, k, v: sharded.run(
        kernels.blockwise, m, q, k, v, None, data_axis="dp", head_axis=head_axis,
        token_axes=tokens, scale=0.25, block_q=block, block_kv=block))


@pytest.mark.parametrize("axes,heads,length,block,head_axis", [
    ({"sp": 8}, 3, 256, 32, "sp"),            # 3 heads on 8: the ring over sp
    ({"sp": 8}, 5, 200, 16, "sp"),            # 25 tokens a device: blocks padded
    ({"dp": 2, "sp": 4}, 3, 96, 64, "sp"),    # the batch over dp beside it
    ({"ring": 8}, 8, 128, 16, None),          # the ring's own axis
    ({"ring": 2, "sp": 4}, 8, 128, 16, "sp"),  # 2-D: heads over sp, the ring over ring
    ({"ring": 2, "sp": 4}, 3, 128, 16, "sp"),  # 3 heads: the ring over both
    ({"ring": 4, "tp": 2}, 4, 128, 16, "tp"),  # heads over tp beside the ring
])
def test_ring_equals_one_device(axes, heads, length, block, head_axis):
    q, k, v = qkv(2, heads, length)
    got = attended(mesh(**axes), head_axis, block)(q, k, v)
    assert float(jnp.abs(got - kernels.reference(q, k, v, scale=0.25)).max()) <= TOLERANCE


@pytest.mark.parametrize("name", ["splash", "int8"])
def test_a_backends_kernel_runs_each_share(name):
    """Splash and int8 (interpreted off TPU) on each share round the ring, the shares
    merged by their log-sum-exps: equal to one device (int8 within its bound of float32
    attention; it smooths each share's keys by their own mean, and these keys drift
    along the tokens, so the shares' means differ), 2-D and with blocks padded."""
    from porter.transforms.attention import backends, int8

    [backend] = [b for b in backends.BUILTIN if b.name == name]
    for axes, heads, length, head_axis in (({"ring": 4}, 2, 512, None),
                                           ({"ring": 2, "sp": 4}, 4, 400, "sp")):
        q, k, v = qkv(1, heads, length)
        k = k + jnp.linspace(-3.0, 3.0, length)[:, None]
        m = mesh(**axes)
        tokens = tuple(axis for axis in ("ring", "sp") if axis in axes)

        def run(q, k, v, m=m, tokens=tokens, head_axis=head_axis):
            return sharded.run(backend.kernel, m, q, k, v, None, data_axis="dp",
                               head_axis=head_axis, token_axes=tokens, share=backend.share,
                               scale=0.25, block_q=128, block_kv=128, platform="cpu")

        assert "pallas_call" in str(jax.make_jaxpr(run)(q, k, v))  # the kernel, in the ring
        got = jax.jit(run)(q, k, v)
        want = kernels.reference(q, k, v, scale=0.25)
        bound = TOLERANCE if name == "splash" else int8.TOLERANCE * float(jnp.abs(want).max())
        assert float(jnp.abs(got - want).max()) <= bound, axes


@pytest.mark.parametrize("axes,heads,exchanges", [
    ({"sp": 8}, 3, {"collective-permute"}),
    ({"ring": 2, "sp": 4}, 8, {"collective-permute", "all-to-all"}),
])
def test_the_shares_go_round_and_are_never_gathered(axes, heads, exchanges):
    q, k, v = qkv(1, heads, 256)
    text = attended(mesh(**axes)).lower(q, k, v).compile().as_text()
    assert all(kind in text for kind in exchanges) and "all-gather" not in text


def test_which_axes_ring():
    q, k, v = qkv(1, 8, 64)
    three = qkv(1, 3, 64)[0]

    def circle(axes, q=q, k=k, keep=None, head_axis="sp"):
        m = mesh(**axes)
        tokens = tuple(axis for axis in ("ring", "sp") if axis in axes)
        heads = sharded.layout(m, q.shape, "dp", head_axis)[1]
        return sharded.ring_axes(m, q, k, keep, tokens, heads)

    assert circle({"sp": 8}) == ()  # 8 heads: Ulysses
    assert circle({"sp": 8}, three, three) == ("sp",)  # 3 heads: the ring
    assert circle({"ring": 2, "sp": 4}) == ("ring",)
    assert circle({"ring": 2, "sp": 4}, three, three) == ("ring", "sp")
    assert circle({"ring": 8}, k=k[:, :, :16]) == ()  # cross-attention: the keys whole
    assert circle({"ring": 8}, keep=jnp.ones((1, 1, 1, 64), bool)) == ()  # the kernel's
    assert circle({"ring": 8}, q[:, :, :60], k[:, :, :60]) == ()  # 60 tokens on 8


def test_tokens_that_do_not_divide_the_ring_run_the_kernel():
    """60 tokens on a ring of 8: self-attention gathers the keys, cross-attention keeps
    its queries whole (validate refuses such a size for a family that knows its
    tokens: ``sharding.token_problems``); both equal one device."""
    m = mesh(ring=8)
    q, k, v = qkv(1, 2, 60)
    assert float(jnp.abs(attended(m, None)(q, k, v)
                         - kernels.reference(q, k, v, scale=0.25)).max()) <= TOLERANCE
    text_k, text_v = k[:, :, :20], v[:, :, :20]
    got = attended(m, None)(q, text_k, text_v)
    assert float(jnp.abs(got - kernels.reference(q, text_k, text_v, scale=0.25)).max()) \
        <= TOLERANCE
    assert sharded.split(m, q.shape, "dp", None, ("ring",)) == 1
    assert sharded.split(mesh(ring=8), (1, 2, 64, 16), "dp", None, ("ring",)) == 8
