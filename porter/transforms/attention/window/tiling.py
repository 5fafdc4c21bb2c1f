"""A video's token grid cut into tiles, and which key tiles each query tile sees: the
window's geometry, in numpy (no JAX), read by its kernels and its checks.

The transformer's video tokens form a grid (frames, height, width: the latents cut
into patches). ``attention.window`` cuts the grid into tiles of ``tile`` tokens; a
query in tile (a, b, c) sees every key of the tiles within ``reach`` tiles of it on
each axis, and every key of the first ``global_frames`` frames. Tokens are gathered
into tile order (tile by tile, each tile's tokens together), so each tile is one
block of a kernel; tiles at the grid's far edges are padded (keys masked, queries
dropped).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

#: tiles a video may be cut into (the table of which tile sees which has this squared)
MAX_TILES = 4096


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

    def padded_order(self, devices: int) -> np.ndarray:
        """``order`` with empty tiles after it (``tokens``: padding) until the query
        tiles divide ``devices``, each taking as many."""
        extra = -len(self.table[0]) % devices
        return np.concatenate([self.order, np.full(extra * self.tile_tokens, self.tokens,
                                                   self.order.dtype)])

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


