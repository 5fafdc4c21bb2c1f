"""The kernels that run a window (``porter.transforms.attention.window.kernel_for``
picks one): the backend's own dense kernel on gathered tiles (``gathered``), Porter's
XLA loop over each query tile's table of key tiles (``sparse``), and splash with the
window as its block mask (``splash_blocks``, TPU). Each takes (B, H, tokens, D) arrays
on one device (``attend_windowed`` splits them over the mesh)."""

from __future__ import annotations

import functools
import math

import numpy as np

from porter.transforms.attention.kernels import online_result, online_start, online_step
from porter.transforms.attention.window.tiling import Tiling

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
            return online_step(carry, q_block, k_blocks[index], v_blocks[index],
                                       keep, scale), None

        (_, total, acc), _ = jax.lax.scan(step, online_start(q_block),
                                          (row, row_used))
        return online_result(total, acc)

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


def splash_blocks(q, k, v, valid, *, tiling: Tiling, scale: float, platform: str | None):
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
