"""A window round a ring routes each device's query tiles from the devices holding their
tokens, and their output back (porter/transforms/attention/window/exchange.py): every
row arrives where it is wanted, a device sends only the rows of tiles that straddle
its share, and the windowed call equals dense attention under the window's mask."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from porter.transforms.attention import kernels
from porter.transforms.attention.window import Tiling, attend_windowed, exchange

TOLERANCE = 2e-5


def simulated(rows: np.ndarray, plan: exchange.Route) -> np.ndarray:
    """``exchange.moved`` in numpy: (devices, held) rows -> (devices, wanted)."""
    devices = rows.shape[0]
    out = []
    for dest in range(devices):
        received = [rows[(dest - k) % devices][table[(dest - k) % devices]]
                    for k, table in enumerate(plan.send)]
        out.append(np.concatenate(received + [np.array([-1])])[plan.pick[dest]])
    return np.stack(out)


@pytest.mark.parametrize("grid,tile,devices", [
    ((21, 45, 80), (3, 16, 16), 4),  # Wan 14B at 720p: 105 tiles, 27 a device
    ((4, 6, 8), (1, 3, 4), 3),       # 16 tiles padded to 18
    ((5, 4, 4), (2, 3, 3), 2),       # tiles padded at every edge
])
def test_every_row_arrives_where_it_is_wanted_and_back(grid, tile, devices):
    tiling = Tiling(grid, tile, (1, 1, 1), 1)
    to_tiles, back = exchange.routes(tiling, devices)
    tokens = np.arange(tiling.tokens).reshape(devices, -1)  # each device's share
    tiles = simulated(tokens, to_tiles)
    slots = -(-len(tiling.table[0]) // devices) * tiling.tile_tokens
    order = np.concatenate([tiling.order, np.full(slots * devices - len(tiling.order),
                                                  tiling.tokens)])
    assert np.array_equal(tiles.ravel(), np.where(order < tiling.tokens, order, -1))
    assert np.array_equal(simulated(tiles, back), tokens)


def test_a_device_sends_the_rows_of_the_tiles_at_its_edges_only():
    """Wan 14B at 720p round ring=4: a quarter of a device's share of the queries
    leaves it (one permute a distance round the ring that any device sends), where a
    gather sends three shares."""
    tiling = Tiling((21, 45, 80), (3, 16, 16), (1, 1, 1), 3)
    to_tiles, back = exchange.routes(tiling, 4)
    share = tiling.tokens // 4
    assert to_tiles.rows_sent == back.rows_sent == 1392 + 3072
    assert to_tiles.rows_sent < 0.25 * share
    assert [table.shape[1] for table in to_tiles.send][2] == 0  # none two devices away


@pytest.mark.parametrize("axes,heads,tokens", [
    ({"ring": 4, "tp": 2}, 2, ("ring",)),
    ({"ring": 2, "sp": 4}, 4, ("ring", "sp")),  # 2-D: the heads over sp first
])
def test_a_window_round_a_ring_equals_dense_attention_under_its_mask(axes, heads, tokens):
    tiling = Tiling((4, 6, 8), (3, 3, 4), (1, 0, 1), 1)  # tiles of 3 frames, a device 1 or 2
    q, k, v = (jax.random.normal(key, (2, heads, tiling.tokens, 16), jnp.float32)
               for key in jax.random.split(jax.random.PRNGKey(0), 3))
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(tuple(axes.values())), tuple(axes))
    expected = kernels.reference(q, k, v, jnp.asarray(tiling.keep()), scale=0.25)

    def run(q, k, v):
        return attend_windowed(q, k, v, tiling, scale=0.25, mesh=mesh, data_axis="dp",
                               head_axis="sp" if "sp" in axes else "tp", token_axes=tokens)

    assert float(jnp.abs(jax.jit(run)(q, k, v) - expected).max()) <= TOLERANCE
    assert "ppermute" in str(jax.make_jaxpr(run)(q, k, v))
