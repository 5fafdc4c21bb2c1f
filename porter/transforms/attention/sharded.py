"""Run a kernel under shard_map: batch on the data axis, heads on the head axis.

When the head count does not divide the head axis (Wan 1.3B: 12 heads on 8
devices), attention runs sequence-parallel on that axis instead: each device
takes a slice of the queries and all keys and values (gathered), or, where the
tokens are split over that axis anyway (``sp``), the key/value shares go round its
devices instead (``ring``).
"""

from __future__ import annotations

import math
from functools import partial

from porter.transforms.attention import kernels, ring


def layout(mesh, shape_q, data_axis, head_axis):
    """(batch axis, head axis, query-sequence axis) actually used, each or None."""
    sizes = dict(mesh.shape)
    batch, heads, q_len = shape_q[0], shape_q[1], shape_q[2]

    def fits(axis, n):
        return axis in sizes and sizes[axis] > 1 and n % sizes[axis] == 0

    use_batch = data_axis if fits(data_axis, batch) else None
    if fits(head_axis, heads):
        return use_batch, head_axis, None
    if fits(head_axis, q_len):
        return use_batch, None, head_axis
    return use_batch, None, None


def split(mesh, shape_q, data_axis, head_axis) -> int:
    """Into how many shares attention of queries ``shape_q`` is cut across the mesh."""
    sizes = dict(mesh.shape)
    return max(1, math.prod(sizes[axis] for axis in layout(mesh, shape_q, data_axis, head_axis)
                            if axis is not None))


def run(kernel, mesh, q, k, v, keep, *, data_axis, head_axis, sequence_axis=None,
        rings: bool | None = None, **options):
    """``kernel`` on each device's share of (batch, heads, sequence, head_dim) ``q``,
    ``k``, ``v`` (``layout``). ``sequence_axis``: the axis the tokens are split over
    outside attention (sequence parallelism): the queries, and the keys and values of
    self-attention, are held split over it on the way in and the output on the way out,
    so XLA exchanges tokens for heads with an all-to-all on each side of the kernel
    (Ulysses) rather than gathering the whole sequence on every device. Self-attention
    whose heads do not divide that axis (or any, with ``rings``; never with
    ``rings=False``) runs as ring attention there (``ring``: no kernel of its own)."""
    import jax
    from jax.sharding import PartitionSpec as P

    batch_axis, heads_axis, seq_axis = layout(mesh, q.shape, data_axis, head_axis)
    if _rings(rings, mesh, q, k, keep, sequence_axis, heads_axis, seq_axis):
        return _ring(mesh, q, k, v, batch_axis, sequence_axis, options)
    if batch_axis is None and heads_axis is None and seq_axis is None:
        return kernel(q, k, v, keep, **options)
    tokens = _tokens(mesh, batch_axis, sequence_axis)
    q = tokens(q)
    if k.shape[2] == q.shape[2]:  # self-attention: its keys are the same tokens
        k, v = tokens(k), tokens(v)
    q_spec = P(batch_axis, heads_axis, seq_axis, None)
    kv_spec = P(batch_axis, heads_axis, None, None)  # sequence-parallel: keys gathered
    body = partial(_local, kernel, options)
    if keep is None:
        out = jax.shard_map(lambda q, k, v: body(q, k, v, None), mesh=mesh,
                            in_specs=(q_spec, kv_spec, kv_spec), out_specs=q_spec,
                            check_vma=False)(q, k, v)
    else:
        keep = kernels.as_4d(keep)
        keep_spec = P(batch_axis if keep.shape[0] > 1 else None,
                      heads_axis if keep.shape[1] > 1 else None,
                      seq_axis if keep.shape[2] > 1 else None, None)
        out = jax.shard_map(body, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, keep_spec),
                            out_specs=q_spec, check_vma=False)(q, k, v, keep)
    return tokens(out)


def ringed(mesh, q, k, keep, *, data_axis, head_axis, sequence_axis, rings) -> bool:
    """Does ``run`` run this call as ring attention (no kernel: XLA sees its work)?"""
    _, heads_axis, seq_axis = layout(mesh, q.shape, data_axis, head_axis)
    return _rings(rings, mesh, q, k, keep, sequence_axis, heads_axis, seq_axis)


def _rings(rings, mesh, q, k, keep, sequence_axis, heads_axis, seq_axis) -> bool:
    """Does this call run as ring attention over ``sequence_axis``: self-attention with
    no mask, its tokens split over the axis, asked for (``rings``) or (by default) where
    the heads do not divide the axis and the keys would otherwise be gathered?"""
    size = dict(mesh.shape).get(sequence_axis, 1) if sequence_axis else 1
    if size <= 1 or rings is False or keep is not None or k.shape[2] != q.shape[2] \
            or q.shape[2] % size:
        return False
    return bool(rings) or (heads_axis is None and seq_axis == sequence_axis)


def _ring(mesh, q, k, v, batch_axis, axis: str, options: dict):
    import jax
    from jax.sharding import PartitionSpec as P

    tokens = _tokens(mesh, batch_axis, axis)
    spec = P(batch_axis, None, axis, None)
    body = partial(ring.attend, axis=axis, size=dict(mesh.shape)[axis],
                   scale=options["scale"], block_q=options["block_q"],
                   block_kv=options["block_kv"])
    out = jax.shard_map(body, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec,
                        check_vma=False)(tokens(q), tokens(k), tokens(v))
    return tokens(out)


def _tokens(mesh, batch_axis, sequence_axis):
    """A (batch, heads, sequence, head_dim) array held with its sequence split over
    ``sequence_axis`` (the identity without one)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    if sequence_axis is None or dict(mesh.shape).get(sequence_axis, 1) <= 1:
        return lambda array: array
    sharding = NamedSharding(mesh, P(batch_axis, None, sequence_axis, None))
    return lambda array: jax.lax.with_sharding_constraint(array, sharding)


def _local(kernel, options, q, k, v, keep):
    return kernel(q, k, v, keep, **options)

