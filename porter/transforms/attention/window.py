"""Block-sparse video attention: each query sees the keys of a 3-D window of tiles
around its own (sliding-tile attention), and optionally the first frames' keys.

The transformer's video tokens form a grid (frames, height, width: the latents cut
into patches). ``attention.window`` cuts the grid into tiles of ``tile`` tokens; a
query in tile (a, b, c) sees every key of the tiles within ``reach`` tiles of it on
each axis, and every key of the first ``global_frames`` frames. Tokens are gathered
into tile order (tile by tile, each tile's tokens together), so each tile is one
block of the kernel; a block a query tile does not see is never computed, which is
where the FLOPs go. Tiles at the grid's far edges are padded (keys masked, queries
dropped). The mask is exact: the result is dense attention with the same token mask
(``Tiling.keep``), to the float sums' order.

Three kernels run a window (``kernel_for``): splash with the window as its block mask
(TPU); the backend's own dense kernel on each query tile and the keys it sees, query
tiles of one shape batched together (``Tiling.groups``: cuDNN and its fp8 form on a
GPU, int8 on a TPU, any backend that takes no block mask: no mask is needed, since
each call holds only the keys its queries see); and Porter's XLA loop, walking each
query tile's table of key tiles (``blockwise``, and where query tiles split over the
devices).

Only self-attention over exactly the grid's tokens is windowed (``tiling``); cross-
attention to text, and components with other sequences, run dense. The grid comes
from the call (``video``, set by the denoising loop); ``dense()`` marks the steps
that run dense attention (``dense_steps``: the first steps lay out the video), and
``phase`` keys compiled programs by it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from dataclasses import dataclass

import numpy as np

#: tiles a video may be cut into (the table of which tile sees which has this squared)
MAX_TILES = 4096

_grid = contextvars.ContextVar("porter_video_grid", default=None)
_dense = contextvars.ContextVar("porter_dense_attention", default=False)


@contextlib.contextmanager
def video(grid: tuple[int, int, int] | None):
    """Inside, the video's token grid (frames, height, width) is ``grid`` (None: no
    video: nothing is windowed)."""
    token = _grid.set(None if grid is None else tuple(int(n) for n in grid))
    try:
        yield
    finally:
        _grid.reset(token)


@contextlib.contextmanager
def dense(on: bool = True):
    """Inside (when ``on``), windowed attention runs dense (the anchor steps)."""
    token = _dense.set(bool(on))
    try:
        yield
    finally:
        _dense.reset(token)


def phase() -> str | None:
    """What a program traced now is keyed by besides its shapes: "dense" inside
    ``dense()``, else the grid ("21x30x52": a block's program sees only its token count,
    which two grids may share, 480x832 and 832x480), while a video grid is set; None
    without one (no window configured: nothing to tell apart)."""
    grid = _grid.get()
    if grid is None:
        return None
    return "dense" if _dense.get() else "x".join(map(str, grid))


@dataclass(frozen=True)
class Tiling:
    """A video's token grid cut into tiles, and which key tiles each query tile sees."""

    grid: tuple[int, int, int]
    tile: tuple[int, int, int]
    reach: tuple[int, int, int]
    global_frames: int = 0

    @property
    def tokens(self) -> int:
        return math.prod(self.grid)

    @property
    def tiles(self) -> tuple[int, int, int]:
        """Tiles along each axis (the last ones padded where the tile does not divide)."""
        return tuple(-(-n // t) for n, t in zip(self.grid, self.tile))

    @property
    def tile_tokens(self) -> int:
        return math.prod(self.tile)

    @property
    def padded(self) -> int:
        """Tokens in tile order, padding included."""
        return math.prod(self.tiles) * self.tile_tokens

    @functools.cached_property
    def order(self) -> np.ndarray:
        """For each position in tile order, the token there (``tokens``: padding)."""
        tiled = np.full(tuple(n * t for n, t in zip(self.tiles, self.tile)), self.tokens,
                        np.int32)
        f, h, w = self.grid
        tiled[:f, :h, :w] = np.arange(self.tokens, dtype=np.int32).reshape(self.grid)
        (nf, nh, nw), (tf, th, tw) = self.tiles, self.tile
        return tiled.reshape(nf, tf, nh, th, nw, tw).transpose(0, 2, 4, 1, 3, 5).ravel()

    @functools.cached_property
    def inverse(self) -> np.ndarray:
        """For each token, its position in tile order."""
        found = np.empty(self.tokens, np.int32)
        real = self.order < self.tokens
        found[self.order[real]] = np.nonzero(real)[0]
        return found

    @functools.cached_property
    def seen(self) -> np.ndarray:
        """(query tile, key tile) -> whether the query tile sees the key tile (tiles in
        frame, row, column order; ``MAX_TILES`` bounds its size)."""
        near = None
        for count, reach in zip(self.tiles, self.reach):  # one axis at a time
            index = np.arange(count)
            axis = np.abs(index[:, None] - index[None, :]) <= reach
            near = axis if near is None else (
                near[:, None, :, None] & axis[None, :, None, :]).reshape(
                    len(near) * count, len(near) * count)
        first = np.arange(len(near)) // (len(near) // self.tiles[0]) \
            < self.global_frames // self.tile[0]
        return near | first[None, :]

    @functools.cached_property
    def table(self) -> tuple[np.ndarray, np.ndarray]:
        """(indices, used), each (query tiles, most key tiles any sees): each query
        tile's key tiles, the rest of its row unused (index 0, masked)."""
        seen = self.seen
        width = int(seen.sum(axis=1).max())
        indices = np.zeros((len(seen), width), np.int32)
        used = np.zeros((len(seen), width), bool)
        for row, keys in enumerate(seen):
            found = np.nonzero(keys)[0]
            indices[row, :len(found)], used[row, :len(found)] = found, True
        return indices, used

    @functools.cached_property
    def groups(self) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        """The window as dense calls: the query tiles that hold as many real queries and
        see as many real keys, together; each group (queries (tiles, q), keys (tiles,
        k)), token indices in the grid's order (padding left out: no mask needed)."""
        size = self.tile_tokens
        real = [t[t < self.tokens] for t in self.order.reshape(-1, size)]
        found: dict[tuple[int, int], tuple[list, list]] = {}
        for row, sees in enumerate(self.seen):
            keys = np.concatenate([real[j] for j in np.nonzero(sees)[0]])
            queries, rows = found.setdefault((len(real[row]), len(keys)), ([], []))
            queries.append(real[row])
            rows.append(keys)
        return tuple((np.stack(found[shape][0]), np.stack(found[shape][1]))
                     for shape in sorted(found))

    @functools.cached_property
    def grouped_inverse(self) -> np.ndarray:
        """For each token, its position in the groups' queries laid end to end."""
        laid = np.concatenate([queries.ravel() for queries, _ in self.groups])
        return np.argsort(laid).astype(np.int32)

    @property
    def computed_fraction(self) -> float:
        """Score blocks the kernel computes, against dense attention's (padding and
        unused table entries count: they are computed and masked)."""
        indices, _ = self.table
        return indices.size * self.tile_tokens ** 2 / self.tokens ** 2

    def keep(self, rows=None) -> np.ndarray:
        """The token mask (queries x keys, in the grid's order) the window is: dense
        attention with it gives the window's result. (tokens^2 booleans: for tests;
        ``rows``: those queries' rows only.)"""
        tile_of = np.empty(self.tokens, np.int64)
        tile_of[self.order[self.order < self.tokens]] = \
            np.nonzero(self.order < self.tokens)[0] // self.tile_tokens
        queries = tile_of if rows is None else tile_of[np.asarray(rows)]
        return self.seen[queries[:, None], tile_of[None, :]]


def tiling(section, q_len: int, k_len: int) -> Tiling | None:
    """The window a call runs (None: dense): ``section`` (``attention.window``) set,
    self-attention over exactly the current video's tokens, outside ``dense()``."""
    grid = _grid.get()
    if section is None or grid is None or _dense.get() or q_len != k_len \
            or q_len != math.prod(grid):
        return None
    return _tilings(grid, tuple(section.tile), tuple(section.reach), section.global_frames)


@functools.lru_cache(maxsize=16)
def _tilings(grid, tile, reach, global_frames) -> Tiling:
    return Tiling(grid, tile, reach, global_frames)


def layout(tiling: Tiling, q_shape, mesh, data_axis, head_axis) -> tuple:
    """How ``attend`` splits a call over the mesh (``sharded.layout``'s axes): query
    tiles, not tokens, are what a device takes whole."""
    from porter.transforms.attention import sharded  # lazy: JAX, only when a call windows

    tiles = (*q_shape[:2], len(tiling.table[0]), q_shape[3])
    return sharded.layout(mesh, tiles, data_axis, head_axis)


def kernel_for(tiling: Tiling, backend, axes) -> str:
    """Which kernel runs a window for ``backend`` (an ``AttentionBackend``; None: Porter's
    loop), split over the mesh as ``axes`` (``layout``): "splash" (its block mask) where
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


def attend(q, k, v, tiling: Tiling, *, scale: float, mesh, data_axis, head_axis,
           backend=None, platform: str | None = None, block_q: int = 1024,
           block_kv: int = 1024, counted=None):
    """Windowed attention of (B, H, tokens, D) arrays under ``shard_map`` (batch on
    ``data_axis``, heads on ``head_axis``, or query tiles where the heads do not
    divide it), by the kernel ``kernel_for`` picks for ``backend``. ``counted(flops,
    kernel)``, where given, is told what a kernel the compiler cannot see computes on
    each device (``kernel``: "splash" or "gathered")."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from porter.transforms.attention import backends  # lazy: JAX, only when a call windows

    def tiled(x):  # a zero row for the padding to take
        x = jnp.concatenate([x, jnp.zeros_like(x[:, :, :1])], axis=2)
        return jnp.take(x, jnp.asarray(tiling.order), axis=2)

    axes = layout(tiling, q.shape, mesh, data_axis, head_axis)
    batch_axis, heads_axis, seq_axis = axes
    kernel = kernel_for(tiling, backend, axes)
    q_spec = P(batch_axis, heads_axis, seq_axis, None)
    kv_spec = P(batch_axis, heads_axis, None, None)
    valid = jnp.asarray(tiling.order < tiling.tokens) if kernel != "gathered" else None
    if kernel == "splash":
        body = functools.partial(splash, tiling=tiling, scale=scale, platform=platform)
        args, specs = (tiled(q), tiled(k), tiled(v), valid), (q_spec, kv_spec, kv_spec,
                                                              P(None))
    elif kernel == "gathered":
        options = dict(scale=scale, block_q=block_q, block_kv=block_kv)
        if backends.takes_platform(backend.kernel):
            options["platform"] = platform
        body = functools.partial(gathered, tiling=tiling, kernel=backend.kernel,
                                 options=options, scores=backend.materialises)
        args, specs = (q, k, v), (q_spec, kv_spec, kv_spec)
    else:
        indices, used = (jnp.asarray(a) for a in tiling.table)
        body = functools.partial(sparse, scale=scale, block=tiling.tile_tokens)
        rows = P(seq_axis, None)
        args = (tiled(q), tiled(k), tiled(v), indices, used, valid)
        specs = (q_spec, kv_spec, kv_spec, rows, rows, P(None))
    flops = kernel_flops(tiling, q.shape, kernel)
    if counted is not None and flops is not None:
        shares = math.prod(dict(mesh.shape)[axis] for axis in axes if axis is not None)
        counted(flops / shares, kernel)
    if axes == (None, None, None):
        out = body(*args)
    else:
        out = jax.shard_map(body, mesh=mesh, check_vma=False, in_specs=specs,
                            out_specs=q_spec)(*args)
    return out if kernel == "gathered" else jnp.take(out, jnp.asarray(tiling.inverse),
                                                     axis=2)


#: bytes of gathered keys and values (and scores, for a backend that holds them all)
#: one dense call of a window takes at most (on each device); a group of query tiles
#: that would take more runs as several calls in turn
GATHER_BYTES = 2**30


def gathered(q, k, v, *, tiling: Tiling, kernel, options: dict, scores: bool = False):
    """The window as dense attention (B, H, tokens, D in the grid's order): for each
    group of query tiles of one shape (``Tiling.groups``), their queries and the keys
    they see gathered and run through ``kernel`` with no mask, the group's tiles as the
    batch (several calls in turn where one would hold more than ``GATHER_BYTES``:
    gathered keys and values, and the float32 scores where ``scores``: a kernel that
    materialises them)."""
    import jax
    import jax.numpy as jnp

    batch, heads, _, dim = q.shape
    outputs = []
    for queries, keys in tiling.groups:
        rows, q_len = queries.shape
        k_len = keys.shape[1]
        per_row = batch * heads * k_len * (2 * dim * k.dtype.itemsize
                                           + (4 * q_len if scores else 0))
        calls = -(-rows // max(1, GATHER_BYTES // per_row))
        chunk = -(-rows // calls)  # calls of equal size, the last padded

        def call(indices, q_len=q_len, k_len=k_len):
            q_index, k_index = indices

            def take(x, index, length):  # (B, H, n, length, D) -> (B n, H, length, D)
                n = index.shape[0]
                x = jnp.take(x, index.ravel(), axis=2).reshape(batch, heads, n, length, dim)
                return jnp.moveaxis(x, 2, 1).reshape(batch * n, heads, length, dim)

            n = q_index.shape[0]
            out = kernel(take(q, q_index, q_len), take(k, k_index, k_len),
                         take(v, k_index, k_len), None, **options)
            return jnp.moveaxis(out.reshape(batch, n, heads, q_len, dim), 1, 2)

        if calls == 1:
            out = call((jnp.asarray(queries), jnp.asarray(keys)))
        else:  # chunk after chunk; the padding repeats the last tile, its output dropped
            padded = [np.concatenate([a, np.repeat(a[-1:], calls * chunk - rows, axis=0)])
                      for a in (queries, keys)]
            out = jax.lax.map(call, tuple(jnp.asarray(a.reshape(calls, chunk, -1))
                                          for a in padded))  # (calls, B, H, chunk, q, D)
            out = jnp.moveaxis(out, 0, 2).reshape(batch, heads, calls * chunk, q_len,
                                                  dim)[:, :, :rows]
        outputs.append(out.reshape(batch, heads, rows * q_len, dim))
    laid = jnp.concatenate(outputs, axis=2)
    return jnp.take(laid, jnp.asarray(tiling.grouped_inverse), axis=2).astype(q.dtype)


def sparse(q, k, v, indices, used, valid, *, scale: float, block: int):
    """Block-sparse attention in tile order: query block i (``block`` tokens) attends
    to the key blocks ``indices[i][used[i]]`` only, with an online softmax over them
    (the blockwise kernel's, walking a table instead of every block); ``valid``
    masks padded keys. Query blocks: ``len(indices)`` (a shard's rows)."""
    import jax
    import jax.numpy as jnp

    from porter.transforms.attention import kernels  # lazy: JAX, only when traced

    batch, heads, _, dim = q.shape
    q_blocks = jnp.moveaxis(q.reshape(batch, heads, -1, block, dim), 2, 0)
    k_blocks = jnp.moveaxis(k.reshape(batch, heads, -1, block, dim), 2, 0)
    v_blocks = jnp.moveaxis(v.reshape(batch, heads, -1, block, dim), 2, 0)
    valid_blocks = valid.reshape(-1, block)

    def one_query_block(args):
        q_block, row, row_used = args

        def step(carry, entry):
            index, on = entry
            keep = jnp.logical_and(valid_blocks[index], on)[None, None, None, :]
            return kernels.online_step(carry, q_block, k_blocks[index], v_blocks[index],
                                       keep, scale), None

        (_, total, acc), _ = jax.lax.scan(step, kernels.online_start(q_block),
                                          (row, row_used))
        return kernels.online_result(total, acc)

    out = jax.lax.map(one_query_block, (q_blocks, indices, used))
    return jnp.moveaxis(out, 0, 2).reshape(q.shape).astype(q.dtype)


#: tiles splash takes a window in (it visits every pair of blocks in Python while
#: tracing: a million pairs take seconds); more run Porter's XLA loop
SPLASH_TILES = 1024


def splash_fits(tiling: Tiling, axes) -> bool:
    """Can splash run the window (on TPU)? Its blocks are the tiles, a multiple of the
    TPU's 128 lanes, at most ``SPLASH_TILES`` of them; and its block mask is static, so
    the query tiles stay whole on each device (heads or the batch split, not the
    queries)."""
    return tiling.tile_tokens % 128 == 0 and math.prod(tiling.tiles) <= SPLASH_TILES \
        and axes[2] is None


def splash(q, k, v, valid, *, tiling: Tiling, scale: float, platform: str | None):
    """The window through splash attention, in tile order: its block mask says which
    (query tile, key tile) blocks exist, and the kernel skips the rest; padded keys are
    segment 0. Compiled by Mosaic for a TPU, interpreted elsewhere (tests)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as kernel_lib,
    )
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_mask as mask_lib,
    )

    batch, heads, length, _ = q.shape
    mask = mask_lib.MultiHeadMask([_tile_mask_type()(tiling) for _ in range(heads)])
    block = tiling.tile_tokens
    sizes = kernel_lib.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block)
    attend_ = kernel_lib.make_splash_mha_single_device(
        mask=mask, block_sizes=sizes, interpret=(platform or jax.default_backend()) != "tpu")
    segments = kernel_lib.SegmentIds(q=jnp.ones((batch, length), jnp.int32),
                                     kv=jnp.broadcast_to(valid.astype(jnp.int32),
                                                         (batch, length)))
    scaled = (q * jnp.asarray(scale, q.dtype))  # splash does not scale q
    return jax.vmap(attend_)(scaled, k, v, segments).astype(q.dtype)


@functools.cache
def _tile_mask_type():
    """``TileMask``: splash's Mask (its module imported only where splash runs)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_mask as mask_lib,
    )

    class TileMask(mask_lib.Mask):
        """The window's token mask in tile order, for splash: every block is one (query
        tile, key tile) pair, all kept or all not (``Tiling.seen``), computed per block
        as splash asks rather than held whole (75,600^2 tokens would be 5.7 GB)."""

        def __init__(self, tiling: Tiling):
            self.tiling = tiling

        @property
        def shape(self) -> tuple[int, int]:
            return (self.tiling.padded, self.tiling.padded)

        def __getitem__(self, index) -> np.ndarray:
            rows, columns = (range(*i.indices(self.tiling.padded)) for i in index)
            size = self.tiling.tile_tokens
            if rows and columns and rows[0] // size == rows[-1] // size \
                    and columns[0] // size == columns[-1] // size:  # one block: all or none
                return np.full((len(rows), len(columns)),
                               self.tiling.seen[rows[0] // size, columns[0] // size])
            q_tiles = np.asarray(rows) // size
            k_tiles = np.asarray(columns) // size
            return self.tiling.seen[q_tiles[:, None], k_tiles[None, :]]

        def __eq__(self, other) -> bool:
            return isinstance(other, TileMask) and other.tiling == self.tiling

        def __hash__(self) -> int:
            return hash(self.tiling)

    return TileMask
