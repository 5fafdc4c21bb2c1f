"""Run a kernel under shard_map: batch on the data axis, heads on the head axis.

When the head count does not divide the head axis (Wan 1.3B: 12 heads on 8
devices), attention runs sequence-parallel on that axis instead: each device
takes a slice of the queries and all keys and values (gathered), or, where the
tokens are split over that axis anyway (``sp``), the key/value shares go round its
devices instead (``ring``), as they do over a ``ring`` axis.
"""

from __future__ import annotations

import math
from functools import partial

from porter.transforms import sharding
from porter.transforms.attention import kernels, ring


def layout(mesh, shape_q, data_axis, head_axis):
    """(batch axis, head axis, query-sequence axis) actually used, each or None."""
    return layout_of(dict(mesh.shape), shape_q, data_axis, head_axis)


def layout_of(sizes: dict, shape_q, data_axis, head_axis):
    """``layout`` from the mesh's axes and sizes alone (``porter plan`` has no mesh)."""
    batch, heads, q_len = shape_q[0], shape_q[1], shape_q[2]

    def fits(axis, n):
        return axis in sizes and sizes[axis] > 1 and n % sizes[axis] == 0

    use_batch = data_axis if fits(data_axis, batch) else None
    if fits(head_axis, heads):
        return use_batch, head_axis, None
    if fits(head_axis, q_len):
        return use_batch, None, head_axis
    return use_batch, None, None


def split(mesh, shape_q, data_axis, head_axis, token_axes=()) -> int:
    """Into how many shares attention of queries ``shape_q`` is cut across the mesh, as
    ``run`` cuts it where it runs a kernel outside a ring (``ring_split``: round one)."""
    batch_axis, heads_axis, seq_axis = layout(mesh, shape_q, data_axis, head_axis)
    axes = (batch_axis, heads_axis, *query_token_axes(mesh, shape_q[2], token_axes, seq_axis))
    return max(1, size(mesh, [axis for axis in axes if axis is not None]))


def query_token_axes(mesh, length: int, token_axes, seq_axis) -> tuple[str, ...]:
    """The axes a kernel's ``length`` queries (tokens, or a window's query tiles) stay
    split over: the ring's (where they divide it), and the head axis where the heads
    do not divide it."""
    seq = (seq_axis,) if seq_axis else ()
    ring_axis = ring_of(token_axes)
    return ring_axis + seq if ring_axis and length % size(mesh, ring_axis + seq) == 0 \
        else seq


def run(kernel, mesh, q, k, v, keep, *, data_axis, head_axis, token_axes=(), share=None,
        mosaic=False, **options):
    """``kernel`` on each device's share of (batch, heads, sequence, head_dim) ``q``,
    ``k``, ``v`` (``layout``). ``token_axes``: the axes the tokens are split over
    outside attention (sequence parallelism, ``sharding.token_axes``): the queries, and
    the keys and values of self-attention, are held split over them on the way in and
    the output on the way out. Over ``sp`` XLA exchanges tokens for heads with an
    all-to-all on each side of the kernel (Ulysses) rather than gathering the whole
    sequence on every device; self-attention runs as ring attention over ``ring``, and
    over ``sp`` too where the heads do not divide it (``ring_axes``; no kernel of its
    own: Porter's online softmax in XLA, or ``share``, the backend's kernel on one
    share, where it has one), the heads over ``sp`` beside the ring where they do.
    ``mosaic``: the kernel is compiled by Mosaic (a TPU's), which XLA cannot split."""
    import jax
    from jax.sharding import PartitionSpec as P

    batch_axis, heads_axis, seq_axis = layout(mesh, q.shape, data_axis, head_axis)
    tokens = tokens_held(mesh, batch_axis, token_axes)
    circle = ring_axes(mesh, q, k, keep, token_axes, heads_axis)
    if circle:
        spec = P(batch_axis, heads_axis, joined(circle), None)
        if share is not None:
            share = partial(share, scale=options["scale"], block_q=options["block_q"],
                            block_kv=options["block_kv"], platform=options.get("platform"))
        body = partial(ring.attend, axis=circle, size=size(mesh, circle),
                       scale=options["scale"], block_q=options["block_q"],
                       block_kv=options["block_kv"], share=share)
        return tokens(jax.shard_map(body, mesh=mesh, in_specs=(spec, spec, spec),
                                    out_specs=spec, check_vma=False)(
                                        tokens(q), tokens(k), tokens(v)))
    # the queries stay split over the ring's axis, and over the head axis where the
    # heads do not divide it (sequence-parallel: the keys gathered)
    seq = joined(query_token_axes(mesh, q.shape[2], token_axes, seq_axis))
    if batch_axis is None and heads_axis is None and seq is None:
        if not mosaic or mesh.size == 1:
            return kernel(q, k, v, keep, **options)
        body = partial(_local, kernel, options)
        if keep is None:
            return whole_on_each(lambda q, k, v: body(q, k, v, None), mesh, q, k, v)
        return whole_on_each(body, mesh, q, k, v, keep)
    q = tokens(q)
    if k.shape[2] == q.shape[2]:  # self-attention: its keys are the same tokens
        k, v = tokens(k), tokens(v)
    q_spec = P(batch_axis, heads_axis, seq, None)
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
                      seq if keep.shape[2] > 1 else None, None)
        out = jax.shard_map(body, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, keep_spec),
                            out_specs=q_spec, check_vma=False)(q, k, v, keep)
    return tokens(out)


def whole_on_each(body, mesh, *args):
    """``body`` on every device with the whole of each of ``args`` (a call nothing
    splits: a text encoder's 77 tokens of 3 heads on dp=2 x tp=4). XLA runs an
    operation it cannot split so by itself, but not a Mosaic kernel, which it cannot
    see into: its compile stops at "Mosaic kernels cannot be automatically
    partitioned"."""
    import jax
    from jax.sharding import PartitionSpec as P

    return jax.shard_map(body, mesh=mesh, in_specs=tuple(P() for _ in args),
                         out_specs=P(), check_vma=False)(*args)


def ring_axes(mesh, q, k, keep, token_axes, heads_axis) -> tuple[str, ...]:
    """The token axes whose devices pass their keys and values round a ring for this
    call: ``ring``, and ``sp`` where the heads do not go over it (they do not divide
    it). None for cross-attention (its keys are whole), with a mask (the kernel's
    path), or where the tokens do not divide the axes."""
    if keep is not None or k.shape[2] != q.shape[2] or q.shape[2] % size(mesh, token_axes):
        return ()
    return tuple(axis for axis in token_axes if axis != heads_axis)


def ring_split(mesh, q, k, keep, *, data_axis, head_axis, token_axes) -> int:
    """Into how many shares ``run`` cuts this call round a ring (the batch, the heads
    and the ring's devices; the other axes repeat it), 0 where it runs no ring."""
    batch_axis, heads_axis, _ = layout(mesh, q.shape, data_axis, head_axis)
    circle = ring_axes(mesh, q, k, keep, token_axes, heads_axis)
    return size(mesh, [a for a in (batch_axis, heads_axis, *circle) if a]) if circle else 0


def ring_of(token_axes) -> tuple[str, ...]:
    """The ``ring`` among the tokens' axes, if it is one of them."""
    return tuple(axis for axis in token_axes if axis == sharding.RING_AXIS)


def size(mesh, axes) -> int:
    sizes = dict(mesh.shape)
    return math.prod(sizes[axis] for axis in axes)


def joined(axes: tuple):
    """A partition spec's entry for ``axes``: None, one axis, or several."""
    return axes[0] if len(axes) == 1 else (axes or None)


def tokens_held(mesh, batch_axis, token_axes):
    """A (batch, heads, sequence, head_dim) array held with its sequence split over
    ``token_axes`` (the identity without any)."""
    return held(mesh, batch_axis, None, joined(tuple(token_axes))) if token_axes \
        else (lambda array: array)


def held(mesh, batch_axis, heads_axis, seq):
    """A (batch, heads, sequence, head_dim) array held split as said (each None, an
    axis or several): a constraint XLA meets with whatever exchange it takes."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    sharding = NamedSharding(mesh, P(batch_axis, heads_axis, seq, None))
    return lambda array: jax.lax.with_sharding_constraint(array, sharding)


def _local(kernel, options, q, k, v, keep):
    return kernel(q, k, v, keep, **options)

