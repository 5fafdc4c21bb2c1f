"""Block-sparse video attention: each query sees the keys of a 3-D window of tiles
around its own (sliding-tile attention), and optionally the first frames' keys.

The window's geometry is a ``Tiling`` (``tiling``: tiles, which key tiles each query
tile sees); a block a query tile does not see is never computed, which is where the
FLOPs go. The mask is exact: the result is dense attention with the same token mask
(``Tiling.keep``), to the float sums' order.

Three kernels run a window (``kernel_for``; ``kernels``): splash with the window as its
block mask (TPU); the backend's own dense kernel on each query tile and the keys it
sees, query tiles of one shape batched together (``Tiling.groups``: cuDNN and its fp8
form on a GPU, int8 on a TPU, any backend that takes no block mask: no mask is needed,
since each call holds only the keys its queries see); and Porter's XLA loop, walking
each query tile's table of key tiles (``blockwise``, and where query tiles split over
the devices). What a recipe's window may be is checked in ``checks``.

Only self-attention over exactly the grid's tokens is windowed (``for_call``); cross-
attention to text, and components with other sequences, run dense. The grid comes
from the call: the attention pass sets ``trace_context.VIDEO_GRID`` around a
transformer's calls, but for the steps that run dense attention (``dense_steps``: the
first steps lay out the video), which run the programs of a port without a window; the
grid keys the compiled programs.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from porter.runtime import trace_context
from porter.transforms.attention import backends, sharded
from porter.transforms.attention.window import exchange
from porter.transforms.attention.window.kernels import (
    gathered,
    sparse,
    splash_blocks,
    splash_fits,
)
from porter.transforms.attention.window.tiling import MAX_TILES, Tiling

__all__ = ["MAX_TILES", "Tiling", "attend_windowed", "for_call", "kernel_flops",
           "kernel_for", "tile_layout"]


def for_call(section, q_len: int, k_len: int) -> Tiling | None:
    """The window a call runs (None: dense): ``section`` (``attention.window``) set,
    self-attention over exactly the current video's tokens (no grid in the dense
    steps)."""
    grid = trace_context.VIDEO_GRID.get()
    if section is None or grid is None or q_len != k_len or q_len != math.prod(grid):
        return None
    return _tilings(grid, tuple(section.tile), tuple(section.reach), section.global_frames)


@functools.lru_cache(maxsize=16)
def _tilings(grid, tile, reach, global_frames) -> Tiling:
    return Tiling(grid, tile, reach, global_frames)


def tile_layout(tiling: Tiling, q_shape, mesh, data_axis, head_axis, token_axes=()) -> tuple:
    """How ``attend_windowed`` splits a call over the mesh (``sharded.layout``'s axes, the
    last an axis, several or None): query tiles, not tokens, are what a device takes
    whole. Over a ``ring`` among ``token_axes`` the devices take the query tiles in
    turn, each windowing its own against every key (the tiles padded to a multiple of
    the devices where they do not divide: ``attend_windowed``)."""
    tiles = (*q_shape[:2], len(tiling.table[0]), q_shape[3])
    batch_axis, heads_axis, seq_axis = sharded.layout(mesh, tiles, data_axis, head_axis)
    seq = (seq_axis,) if seq_axis else ()
    return batch_axis, heads_axis, sharded.joined(sharded.ring_of(token_axes) + seq)


def kernel_for(tiling: Tiling, backend, axes) -> str:
    """Which kernel runs a window for ``backend`` (an ``AttentionBackend``; None: Porter's
    loop), split over the mesh as ``axes`` (``tile_layout``): "splash" (its block mask) where
    the backend is splash and the window fits it; "gathered" (the backend's own dense
    kernel on each group of query tiles and the keys they see) for a backend without a
    block mask while the query tiles stay whole on each device; else "sparse"."""
    name = getattr(backend, "name", None)
    if name == "splash":
        return "splash" if splash_fits(tiling, axes) else "sparse"
    if name in (None, "blockwise") or axes[2] is not None:
        return "sparse"
    return "gathered"


def kernel_flops(tiling: Tiling, q_shape, kernel: str) -> float | None:
    """What ``kernel`` computes for a windowed call of queries ``q_shape`` where the
    compiler cannot see inside it (splash's kept blocks, the gathered calls' scores),
    all devices together; None for Porter's loop, which the compiler counts itself."""
    batch, heads, _, dim = q_shape
    if kernel == "splash":
        pairs = float(tiling.seen.sum()) * tiling.tile_tokens ** 2
    elif kernel == "gathered":
        pairs = float(sum(queries.size * keys.shape[1] for queries, keys in tiling.groups))
    else:
        return None
    return 4.0 * batch * heads * dim * pairs


def attend_windowed(q, k, v, tiling: Tiling, *, scale: float, mesh, data_axis, head_axis,
                    backend=None, platform: str | None = None, block_q: int = 1024,
                    block_kv: int = 1024, counted=None, token_axes=(), mosaic=False):
    """Windowed attention of (B, H, tokens, D) arrays under ``shard_map`` (batch on
    ``data_axis``, heads on ``head_axis``, or query tiles where the heads do not
    divide it), by the kernel ``kernel_for`` picks for ``backend``. ``counted(flops,
    kernel)``, where given, is told what a kernel the compiler cannot see computes on
    each device (``kernel``: "splash" or "gathered"). ``token_axes``: the axes the
    tokens are split over outside attention (``sp``, ``ring``): the call takes every
    token of its heads first (an all-to-all where the heads divide the head axis,
    Ulysses; else a gather, as over ``ring``), so that the tiles' reordering of the
    tokens is each device's own, and hands its output back split by tokens. Over
    ``ring`` each device then computes its own share of the query tiles, against
    every key (``tile_layout``), where the ring would pass the keys round; where the
    ring alone splits the tiles, a device's query tiles come from the devices holding
    their tokens and their output goes back to them (``exchange``), only the keys and
    values being gathered. ``mosaic``: the backend's kernel is compiled by Mosaic (a
    TPU's), so a call that nothing splits runs whole on each device
    (``sharded.whole_on_each``)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    axes = tile_layout(tiling, q.shape, mesh, data_axis, head_axis, token_axes)
    batch_axis, heads_axis, seq_axis = axes
    # query tiles split over devices they do not divide: padded with tiles of nothing
    order = tiling.padded_order(sharded.size(mesh, _named((seq_axis,))))
    extra = (len(order) - len(tiling.order)) // tiling.tile_tokens

    def tiled(x):  # a zero row for the padding to take
        x = jnp.concatenate([x, jnp.zeros_like(x[:, :, :1])], axis=2)
        return jnp.take(x, jnp.asarray(order), axis=2)

    # a ring's devices hold its share of the tokens until each has its heads (in one
    # step XLA gathered every head of every token on each device: 4 times the bytes)
    ring = sharded.ring_of(token_axes)
    ring_held = sharded.held(mesh, batch_axis, heads_axis, sharded.joined(ring))
    every_token = sharded.held(mesh, batch_axis, heads_axis, None)
    # round the ring alone, each device's query tiles come from the devices holding
    # their tokens (mostly itself), and their output goes back so, not gathered
    routed = exchange.applies(tiling, dict(mesh.shape), ring, seq_axis) and _route(
        tiling, mesh, batch_axis, heads_axis, ring[0])
    if token_axes:  # held split by tokens as they come (else XLA may carry the heads'
        # split back into the projections before, and gather there), then exchanged
        by_tokens = sharded.tokens_held(mesh, batch_axis, token_axes)
        k, v = (every_token(ring_held(by_tokens(x))) for x in (k, v))
        q = routed[0](ring_held(by_tokens(q))) if routed \
            else every_token(ring_held(by_tokens(q)))
    kernel = kernel_for(tiling, backend, axes)
    q_tiles = q if routed else tiled(q)
    q_spec = P(batch_axis, heads_axis, seq_axis, None)
    kv_spec = P(batch_axis, heads_axis, None, None)
    valid = jnp.asarray(order < tiling.tokens) if kernel != "gathered" else None
    if kernel == "splash":
        body = functools.partial(splash_blocks, tiling=tiling, scale=scale, platform=platform)
        args, specs = (q_tiles, tiled(k), tiled(v), valid), (q_spec, kv_spec, kv_spec,
                                                              P(None))
    elif kernel == "gathered":
        options = dict(scale=scale, block_q=block_q, block_kv=block_kv)
        if backends.takes_platform(backend.kernel):
            options["platform"] = platform
        body = functools.partial(gathered, tiling=tiling, kernel=backend.kernel,
                                 options=options, scores=backend.materialises)
        args, specs = (q, k, v), (q_spec, kv_spec, kv_spec)
    else:
        indices, used = (jnp.asarray(np.concatenate([a, np.zeros((extra, a.shape[1]),
                                                                 a.dtype)]))
                         for a in tiling.table)  # the padding's rows see no key
        body = functools.partial(sparse, scale=scale, block=tiling.tile_tokens)
        rows = P(seq_axis, None)
        args = (q_tiles, tiled(k), tiled(v), indices, used, valid)
        specs = (q_spec, kv_spec, kv_spec, rows, rows, P(None))
    flops = kernel_flops(tiling, q.shape, kernel)
    if counted is not None and flops is not None:
        counted(flops / sharded.size(mesh, _named(axes)), kernel)
    if axes == (None, None, None):
        out = sharded.whole_on_each(body, mesh, *args) \
            if mosaic and kernel != "sparse" and mesh.size > 1 else body(*args)
    else:
        out = jax.shard_map(body, mesh=mesh, check_vma=False, in_specs=specs,
                            out_specs=q_spec)(*args)
    if routed:
        out = routed[1](out)
    elif kernel != "gathered":  # gathered first where split (XLA took each token's row
        # by an all-reduce of every device's partial take: twice the bytes)
        out = jnp.take(every_token(out) if seq_axis else out,
                       jnp.asarray(tiling.inverse), axis=2)
    return sharded.tokens_held(mesh, batch_axis, token_axes)(out)


def _route(tiling: Tiling, mesh, batch_axis, heads_axis, ring: str) -> tuple:
    """(tokens -> their query tiles, tile outputs -> tokens), each a function of a
    (batch, heads, sequence, dim) array split over ``ring`` (``exchange``)."""
    import jax
    from jax.sharding import PartitionSpec as P

    devices = sharded.size(mesh, (ring,))
    spec = P(batch_axis, heads_axis, ring, None)
    return tuple(jax.shard_map(functools.partial(exchange.moved, plan=plan, axis=ring,
                                                 devices=devices),
                               mesh=mesh, in_specs=(spec,), out_specs=spec,
                               check_vma=False)
                 for plan in exchange.routes(tiling, devices))


def _named(axes) -> tuple[str, ...]:
    """The mesh axes in a layout's entries (each None, an axis or a tuple of them)."""
    return tuple(name for entry in axes if entry is not None
                 for name in (entry if isinstance(entry, tuple) else (entry,)))
