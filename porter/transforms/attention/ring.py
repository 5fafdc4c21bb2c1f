"""Ring attention: self-attention with the tokens split over mesh axes (``ring``, and
``sp`` where the heads do not divide it), each device holding its share of the
queries, keys and values alike. The key/value shares go round the devices one hop a
step (``lax.ppermute``); each device folds every share that reaches it into an online
softmax over its own queries (``kernels.online_step``, in blocks of ``block_q`` queries
and ``block_kv`` keys). Any head count splits so (Ulysses' all-to-all needs the heads
to divide the axis), no device ever holds the whole sequence's keys, and each hop's
transfer is independent of the arithmetic on the share being passed on, so the two
can overlap.

``attend`` is what runs on each device, inside ``shard_map`` (``sharded.run``).
"""

from __future__ import annotations

from porter.shims import lazy
from porter.transforms.attention import kernels

jax = lazy.module("jax", __name__)
jnp = lazy.module("jax.numpy", __name__)


def attend(q, k, v, *, axis: tuple[str, ...], size: int, scale: float, block_q: int,
           block_kv: int, share=None):
    """This device's queries ``q`` (batch, heads, tokens, head_dim) against the keys and
    values ``k``, ``v`` of all ``size`` devices on the mesh axes ``axis`` (each holding
    its own share, the same shape), in ring order: this device's share first, then
    each the next. ``share(q, k, v)``, where given, is the backend's kernel on one share
    (its output and log-sum-exp: ``AttentionBackend.share``), merged share by share."""
    if share is not None:
        return _by_kernel(q, k, v, share, axis, size)
    length = q.shape[2]
    block_q, block_kv = _even(length, block_q), _even(k.shape[2], block_kv)
    q_blocks = kernels.blocks(kernels.pad(q, 2, block_q), block_q)
    keep = kernels.pad(jnp.ones((1, 1, 1, k.shape[2]), bool), 3, block_kv, value=False)
    keep = jnp.moveaxis(keep.reshape(1, 1, 1, -1, block_kv), 3, 0)  # padded keys: none
    k, v = kernels.pad(k, 2, block_kv), kernels.pad(v, 2, block_kv)

    def absorb(state, k_share, v_share):
        """Every query block's sums with one device's keys and values folded in."""
        k_blocks = kernels.blocks(k_share, block_kv)
        v_blocks = kernels.blocks(v_share, block_kv)

        def one_query_block(args):
            q_block, *carry = args

            def step(carry, inputs):
                k_block, v_block, keep_block = inputs
                return kernels.online_step(carry, q_block, k_block, v_block, keep_block,
                                           scale), None

            return jax.lax.scan(step, tuple(carry), (k_blocks, v_blocks, keep))[0]

        return jax.lax.map(one_query_block, (q_blocks, *state))

    def hop(carry, _):
        # the share this device holds passed on while it is folded in: the transfer
        # does not wait for the arithmetic, nor the arithmetic for the transfer
        state, k_share, v_share = carry
        passed = _passed(k_share, axis, size), _passed(v_share, axis, size)
        return (absorb(state, k_share, v_share), *passed), None

    start = jax.lax.map(kernels.online_start, q_blocks)
    (state, k_last, v_last), _ = jax.lax.scan(hop, (start, k, v), None, length=size - 1)
    _, total, acc = absorb(state, k_last, v_last)
    out = kernels.online_result(total, acc)  # (query blocks, batch, heads, block, dim)
    return kernels.unblocked(out, length).astype(q.dtype)


def _by_kernel(q, k, v, share, axis: tuple[str, ...], size: int):
    """Ring attention with a kernel on each share: the shares' outputs merged by their
    log-sum-exps (each weighted by its share of the whole softmax's total)."""
    def absorb(state, k_share, v_share):
        out, total = state
        part, part_total = share(q, k_share, v_share)
        merged = jnp.logaddexp(total, part_total)
        return (out * jnp.exp(total - merged)[..., None]
                + part * jnp.exp(part_total - merged)[..., None], merged)

    def hop(carry, _):  # passed on while folded in, as in ``attend``
        state, k_share, v_share = carry
        passed = _passed(k_share, axis, size), _passed(v_share, axis, size)
        return (absorb(state, k_share, v_share), *passed), None

    start = share(q, k, v)  # this device's own share first: every total finite
    if size > 1:
        passed = _passed(k, axis, size), _passed(v, axis, size)
        (start, k, v), _ = jax.lax.scan(hop, (start, *passed), None, length=size - 2)
        start = absorb(start, k, v)
    return start[0].astype(q.dtype)


def _even(length: int, block: int) -> int:
    """A block of at most about ``block`` that cuts ``length`` into equal blocks, padded
    to a multiple of 8 at most: a device's share of a 720p Wan video (9,450 tokens on
    8 devices) in blocks of 512 would be padded to 9,728 and compute 6% more."""
    if length <= max(block, 8):
        return length
    size = -(-length // -(-length // block))  # ceil(length / the blocks it takes)
    return -(-size // 8) * 8


def _passed(share, axis: tuple[str, ...], size: int):
    """Each device's share handed to the next device on ``axis``, round the ring."""
    return jax.lax.ppermute(share, axis, [(i, (i + 1) % size) for i in range(size)])
