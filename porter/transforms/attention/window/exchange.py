"""Query tiles to and from the ring devices that hold their tokens.

Round a ``ring`` each device holds a contiguous share of the tokens, and takes a
contiguous share of the query tiles (``tile_layout``). The two mostly overlap: a tile
of a few frames lies in the frames its device holds, but for the tiles at a share's
edges. So a device keeps the rows it holds and receives only the others, one
collective-permute per distance round the ring (each padded to the most any device
sends that far), instead of gathering every token of its heads (Wan 14B at 720p,
3x16x16 tiles, ring=4: each device sends a quarter of its share, not three shares).
The windowed output goes back the same way, each token to the device that holds it.

A ``Route`` is numpy (the tables), built once per shape; ``moved`` runs it on each
device's rows inside ``shard_map``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Route:
    """How each of ``devices`` devices gets its rows. ``send[k]``: (devices, M_k) the
    rows each device sends to the one ``k`` further round (``k`` = 0: its own; M_k the
    most any device sends that far, the rest padding); ``pick``: (devices, rows) each
    wanted row's place among what the device received, shift by shift (the last
    place, one past them all, is a zero row: a row nobody holds)."""

    send: tuple[np.ndarray, ...]
    pick: np.ndarray

    @property
    def rows_sent(self) -> int:
        """Rows each device sends to others (its own kept rows are not sent)."""
        return sum(rows.shape[1] for rows in self.send[1:])


def route(source: np.ndarray, row: np.ndarray) -> Route:
    """The route by which each device gets its wanted rows: ``source`` and ``row``
    (devices, wanted) say, for each row a device wants in order, which device holds
    it and where (-1: none, a zero row)."""
    devices = source.shape[0]
    send, pick = [], np.zeros(source.shape, np.int32)
    total = 0
    for k in range(devices):
        lists = []
        for dest in range(devices):
            origin = (dest - k) % devices
            lists.append(np.nonzero(source[dest] == origin)[0])  # wanted positions
        width = max(len(found) for found in lists)
        table = np.zeros((devices, width), np.int32)
        for dest, found in enumerate(lists):
            origin = (dest - k) % devices
            table[origin, :len(found)] = row[dest, found]
            pick[dest, found] = total + np.arange(len(found))
        send.append(table)
        total += width
    pick[source < 0] = total  # the zero row after everything received
    return Route(tuple(send), pick)


def applies(tiling, sizes: dict, ring: tuple, tiles_axis) -> bool:
    """Does a windowed call route its query tiles (rather than gather every token):
    the tiles are split over the ring alone (``tile_layout``'s last axis), and the
    tokens divide its devices (each holds an equal share). ``sizes``: the mesh's axes
    and sizes."""
    devices = math.prod(sizes[axis] for axis in ring)
    return bool(ring) and tiles_axis == ring[0] and tiling.tokens % devices == 0


@functools.lru_cache(maxsize=16)
def routes(tiling, devices: int) -> tuple[Route, Route]:
    """(tokens to query tiles, tile outputs back to tokens) round ``devices`` ring
    devices: each holds ``tokens / devices`` tokens and ``slots / devices`` places of
    the tile order (padded with empty tiles to divide, as ``attend_windowed`` pads)."""
    held = tiling.tokens // devices
    order = tiling.padded_order(devices)
    slots = len(order) // devices
    wanted = order.reshape(devices, slots)
    real = wanted < tiling.tokens
    to_tiles = route(np.where(real, wanted // held, -1), np.where(real, wanted % held, 0))
    back = tiling.inverse.reshape(devices, held)  # each token's place in the tile order
    return to_tiles, route(back // slots, back % slots)


def moved(x, plan: Route, axis: str, devices: int):
    """Each device's rows (axis 2 of ``x``, a (batch, heads, rows, dim) share) as
    ``plan`` routes them, inside ``shard_map`` over ``axis``."""
    import jax
    import jax.numpy as jnp

    me = jax.lax.axis_index(axis)
    parts = []
    for k, table in enumerate(plan.send):
        if table.shape[1] == 0:
            continue
        part = jnp.take(x, jnp.asarray(table)[me], axis=2)
        if k:
            part = jax.lax.ppermute(part, axis, [(d, (d + k) % devices)
                                                 for d in range(devices)])
        parts.append(part)
    parts.append(jnp.zeros_like(x[:, :, :1]))
    return jnp.take(jnp.concatenate(parts, axis=2), jnp.asarray(plan.pick)[me], axis=2)
