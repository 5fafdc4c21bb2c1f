"""Block-sparse video attention (attention.window): the tiling, the kernel equal to
dense attention with the same mask, sharded as dense attention is, the FLOPs it skips."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from porter.transforms.attention import BUILTIN, kernels, window

BACKENDS = {backend.name: backend for backend in BUILTIN}
TOLERANCE = 2e-5  # float32 on CPU; the sums run in another order than reference's


def mesh(**axes):
    devices = np.array(jax.devices()[: int(np.prod(list(axes.values())))])
    return jax.sharding.Mesh(devices.reshape(tuple(axes.values())), tuple(axes))


def qkv(batch, heads, tokens, dim=16, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    return tuple(jax.random.normal(key, (batch, heads, tokens, dim)) for key in keys)


def test_the_tiling_orders_every_token_once_and_pads_the_far_edges():
    tiling = window.Tiling(grid=(3, 5, 6), tile=(2, 2, 4), reach=(0, 1, 0))
    assert tiling.tiles == (2, 3, 2) and tiling.tile_tokens == 16
    assert tiling.padded == 12 * 16 and tiling.tokens == 90
    real = tiling.order[tiling.order < 90]
    assert sorted(real.tolist()) == list(range(90))  # each token once
    assert (tiling.order[tiling.inverse] == np.arange(90)).all()
    # the first tile: frames 0-1, rows 0-1, columns 0-3 of the grid
    first = tiling.order[:16]
    f, h, w = np.unravel_index(first, (3, 5, 6))
    assert set(f) == {0, 1} and set(h) == {0, 1} and set(w) == {0, 1, 2, 3}


def test_a_query_tile_sees_its_window_and_the_first_frames():
    tiling = window.Tiling(grid=(4, 4, 4), tile=(1, 2, 2), reach=(1, 0, 0),
                           global_frames=1)
    seen = tiling.seen  # tiles: 4 frames x 2 x 2
    index = {c: i for i, c in enumerate(np.ndindex(4, 2, 2))}
    row = seen[index[(2, 1, 0)]]
    expect = {index[(f, 1, 0)] for f in (1, 2, 3)} | {index[(0, a, b)] for a in (0, 1)
                                                     for b in (0, 1)}
    assert set(np.nonzero(row)[0]) == expect
    indices, used = tiling.table
    assert indices.shape == (16, 7) and used.sum(axis=1).max() == 7


@pytest.mark.parametrize("grid,tile,reach,first", [
    ((4, 6, 8), (2, 2, 4), (0, 1, 0), 0),       # tiles divide the grid
    ((5, 6, 7), (2, 4, 4), (1, 0, 1), 2),       # padded edges, the first frames global
    ((3, 4, 4), (1, 2, 2), (1, 1, 1), 0),       # every tile sees every other: dense
])
def test_the_window_is_dense_attention_with_its_mask(grid, tile, reach, first):
    tiling = window.Tiling(grid, tile, reach, first)
    q, k, v = qkv(2, 3, tiling.tokens)
    keep = jnp.asarray(tiling.keep())
    expected = kernels.reference(q, k, v, keep, scale=0.25)
    got = jax.jit(lambda q, k, v: window.attend_windowed(
        q, k, v, tiling, scale=0.25, mesh=mesh(dp=1), data_axis="dp",
        head_axis=None))(q, k, v)
    assert float(jnp.abs(got - expected).max()) <= TOLERANCE
    dense = kernels.reference(q, k, v, None, scale=0.25)
    assert (tiling.keep().all()) == bool(float(jnp.abs(got - dense).max()) <= TOLERANCE)


@pytest.mark.parametrize("axes,heads", [
    ({"dp": 2, "tp": 4}, 4),     # heads split
    ({"tp": 4}, 3),              # 3 heads on 4: the query tiles split (8 of them)
    ({"tp": 8}, 3),              # 8 devices, 12 query tiles: unsplit there
])
def test_sharded_window_equals_unsharded(axes, heads):
    tiling = window.Tiling((4, 6, 8), (1, 3, 4), (1, 0, 1), 1)  # 4 x 2 x 2 = 16 tiles
    if axes == {"tp": 8}:
        tiling = window.Tiling((3, 6, 8), (1, 3, 4), (1, 0, 1), 1)  # 12 tiles
    q, k, v = qkv(2, heads, tiling.tokens)
    expected = kernels.reference(q, k, v, jnp.asarray(tiling.keep()), scale=0.25)
    got = jax.jit(lambda q, k, v: window.attend_windowed(
        q, k, v, tiling, scale=0.25, mesh=mesh(**axes), data_axis="dp",
        head_axis="tp"))(q, k, v)
    assert float(jnp.abs(got - expected).max()) <= TOLERANCE


@pytest.mark.parametrize("heads,backend,exchanged", [
    (4, None, True),          # Porter's loop on each device's heads
    (4, "reference", True),   # a backend's own kernel on gathered keys, likewise
    (3, None, False),         # 3 heads on 4: every token gathered, the query tiles split
])
def test_a_window_beside_tokens_split_over_sp_equals_unsharded(heads, backend, exchanged):
    """The tokens held split over sp outside attention: the heads that divide sp are
    exchanged for tokens (all-to-all, Ulysses), 3 heads on 4 gathered; either way the
    output goes back split by tokens."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    tiling = window.Tiling((4, 6, 8), (1, 3, 4), (1, 0, 1), 1)
    q, k, v = qkv(2, heads, tiling.tokens)
    expected = kernels.reference(q, k, v, jnp.asarray(tiling.keep()), scale=0.25)
    split = mesh(dp=2, sp=4)
    by_tokens = NamedSharding(split, P("dp", None, "sp", None))

    def call(q, k, v):
        q, k, v = (jax.lax.with_sharding_constraint(x, by_tokens) for x in (q, k, v))
        return window.attend_windowed(q, k, v, tiling, scale=0.25, mesh=split,
                                      data_axis="dp", head_axis="sp", token_axes=("sp",),
                                      backend=BACKENDS.get(backend), platform="cpu")
    run = jax.jit(call)
    got = run(q, k, v)
    assert float(jnp.abs(got - expected).max()) <= TOLERANCE
    assert got.sharding.is_equivalent_to(by_tokens, 4)
    assert ("all-to-all" in run.lower(q, k, v).compile().as_text()) == exchanged


def test_the_groups_hold_each_query_once_with_exactly_the_keys_it_sees():
    tiling = window.Tiling((5, 6, 7), (2, 4, 4), (1, 0, 1), 2)  # padded edges, global
    keep = tiling.keep()
    laid = np.concatenate([queries.ravel() for queries, _ in tiling.groups])
    assert sorted(laid.tolist()) == list(range(tiling.tokens))
    assert (laid[tiling.grouped_inverse] == np.arange(tiling.tokens)).all()
    for queries, keys in tiling.groups:
        for row, seen in zip(queries, keys):
            for query in row:
                assert set(seen.tolist()) == set(np.nonzero(keep[query])[0].tolist())
    pairs = sum(queries.size * keys.shape[1] for queries, keys in tiling.groups)
    assert pairs == keep.sum()  # no padding, no unused table entry: the mask's pairs


@pytest.mark.parametrize("grid,tile,reach,first", [
    ((4, 6, 8), (2, 2, 4), (0, 1, 0), 0),       # groups of 8 and 4 query tiles
    ((5, 6, 7), (2, 4, 4), (1, 0, 1), 2),       # padded edges, global frames
])
@pytest.mark.parametrize("rows_per_call", [None, 1, 3])
def test_a_backend_without_a_block_mask_runs_the_window_on_gathered_keys(
        grid, tile, reach, first, rows_per_call, monkeypatch):
    """A dense backend (here ``reference``; cuDNN on a GPU) runs each group of query
    tiles with the keys they see, no mask: equal to dense attention with the window's
    mask, also a few tiles a call when the gathered keys would be too large (3 a call:
    8 tiles in 3 calls, the last padded)."""
    tiling = window.Tiling(grid, tile, reach, first)
    q, k, v = qkv(2, 3, tiling.tokens)
    if rows_per_call is not None:  # the budget of that many of the first group's rows
        (queries, keys), *_ = tiling.groups
        per_row = 2 * 3 * keys.shape[1] * (2 * 16 * 4 + 4 * queries.shape[1])  # k, v, scores
        monkeypatch.setattr(window.kernels, "GATHER_BYTES", rows_per_call * per_row)
    expected = kernels.reference(q, k, v, jnp.asarray(tiling.keep()), scale=0.25)
    counted = []

    def run(q, k, v):
        return window.attend_windowed(q, k, v, tiling, scale=0.25, mesh=mesh(dp=1),
                                      data_axis="dp", head_axis=None,
                                      backend=BACKENDS["reference"],
                                      counted=lambda *a: counted.append(a))
    program = jax.make_jaxpr(run)(q, k, v)
    got = jax.jit(run)(q, k, v)
    counted = counted[:1]  # traced twice
    assert float(jnp.abs(got - expected).max()) <= TOLERANCE
    calls = [e.params["length"] for e in _equations(program.jaxpr)
             if e.primitive.name == "scan"]
    if rows_per_call is None:
        assert calls == []
    elif grid == (4, 6, 8):  # the first group, 8 tiles: 8 calls, or 3 (the last padded)
        assert calls[0] == -(-8 // rows_per_call)
    assert counted == [(window.kernel_flops(tiling, q.shape, "gathered"), "gathered")]
    assert counted[0][0] == 4 * 2 * 3 * 16 * tiling.keep().sum()


def test_pytorchs_cpu_attention_runs_a_window_a_tile_a_call(monkeypatch):
    """``torch-cpu`` (``auto`` on CPU for large calls: a host callback) on gathered
    keys, one query tile a call (inside a loop): the window's masked attention."""
    monkeypatch.setattr(window.kernels, "GATHER_BYTES", 1)
    tiling = window.Tiling((4, 6, 8), (2, 2, 4), (0, 1, 0), 0)
    q, k, v = qkv(1, 2, tiling.tokens)
    expected = kernels.reference(q, k, v, jnp.asarray(tiling.keep()), scale=0.25)
    got = jax.jit(lambda q, k, v: window.attend_windowed(
        q, k, v, tiling, scale=0.25, mesh=mesh(dp=1), data_axis="dp", head_axis=None,
        backend=BACKENDS["torch-cpu"], platform="cpu"))(q, k, v)
    assert float(jnp.abs(got - expected).max()) <= TOLERANCE


@pytest.mark.parametrize("axes,heads,tokens,split", [
    ({"dp": 2, "tp": 4}, 4, (), None),   # heads split: each device its heads' groups
    ({"tp": 4}, 3, (), "tp"),            # the query tiles split: Porter's loop
    # the tokens round a ring beside heads over tp: each ring device its query tiles
    ({"ring": 4, "tp": 2}, 2, ("ring",), "ring"),
    ({"ring": 2, "tp": 4}, 3, ("ring",), ("ring", "tp")),  # and over tp (3 heads)
    ({"ring": 3, "tp": 2}, 2, ("ring",), "ring"),  # 16 tiles padded to 18 over 3
])
def test_gathered_windows_shard_by_heads(axes, heads, tokens, split):
    tiling = window.Tiling((4, 6, 8), (1, 3, 4), (1, 0, 1), 1)  # 16 query tiles
    q, k, v = qkv(2, heads, tiling.tokens)
    layout = window.tile_layout(tiling, q.shape, m := mesh(**axes), "dp", "tp", tokens)
    assert layout[2] == split
    assert window.kernel_for(tiling, BACKENDS["reference"], layout) == ("sparse" if split
                                                                        else "gathered")
    expected = kernels.reference(q, k, v, jnp.asarray(tiling.keep()), scale=0.25)

    def run(q, k, v):
        return window.attend_windowed(q, k, v, tiling, scale=0.25, mesh=m, data_axis="dp",
                                      head_axis="tp", backend=BACKENDS["reference"],
                                      token_axes=tokens)

    got = jax.jit(run)(q, k, v)
    assert float(jnp.abs(got - expected).max()) <= TOLERANCE
    if tokens:  # each device windows its own share of the query tiles (the kernel's map)
        body = max((e.params["jaxpr"] for e in _equations(jax.make_jaxpr(run)(q, k, v).jaxpr)
                    if e.primitive.name == "shard_map"), key=lambda body: len(body.invars))
        shares = int(np.prod([m.shape[axis] for axis in np.atleast_1d(split)]))
        assert body.invars[0].aval.shape[2] == -(-16 // shares) * tiling.tile_tokens


@pytest.mark.parametrize("backend,bound", [("fp8-emulated", 0.08), ("int8", 0.03)])
def test_low_precision_attention_runs_the_window(backend, bound):
    """fp8 (cuDNN's, emulated here) and int8 (its Pallas kernel, interpreted) run a
    window through their own kernels: within their documented error of float32
    attention with the window's mask."""
    tiling = window.Tiling((3, 8, 16), (1, 8, 16), (1, 0, 0), 1)  # 3 tiles of 128
    q, k, v = qkv(1, 2, tiling.tokens, dim=64)
    expected = kernels.reference(q, k, v, jnp.asarray(tiling.keep()), scale=0.125)
    got = jax.jit(lambda q, k, v: window.attend_windowed(
        *(x.astype(jnp.bfloat16) for x in (q, k, v)), tiling, scale=0.125,
        mesh=mesh(dp=1), data_axis="dp", head_axis=None, backend=BACKENDS[backend],
        platform="cpu"))(q, k, v)
    error = float(jnp.linalg.norm(got.astype(jnp.float32) - expected)
                  / jnp.linalg.norm(expected))
    assert error <= bound, error


def test_the_kernel_computes_only_the_blocks_a_window_sees():
    """Each query tile's loop walks its table row (the key tiles it sees), not every
    tile: the scan's trip count is the row's width; a sixteenth of dense here."""
    q, k, v = qkv(1, 2, 512)
    for reach, trips in (((0, 0, 0), 1), ((3, 1, 1), 16)):
        tiling = window.Tiling((8, 8, 8), (2, 4, 4), reach)  # 4 x 2 x 2 tiles
        program = jax.make_jaxpr(lambda q, k, v: window.attend_windowed(
            q, k, v, tiling, scale=0.25, mesh=mesh(dp=1), data_axis="dp",
            head_axis=None))(q, k, v)
        lengths = [eqn.params["length"] for eqn in _equations(program.jaxpr)
                   if eqn.primitive.name == "scan"]
        assert lengths == [16, trips]  # the query tiles (lax.map), then each one's keys
        assert tiling.computed_fraction == trips / 16


def _equations(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                yield from _equations(inner)


WINDOWED = """\
model: {family: wan, source: tiny}
generate: {prompt: "a cat", height: 64, width: 64, frames: 17, steps: 3,
           max_sequence_length: 16}
attention:
  backend: auto
  window: {tile: [1, 2, 2], reach: [1, 1, 0], global_frames: 1, dense_steps: 1}
"""


@pytest.mark.slow
def test_a_windowed_run_is_the_dense_run_with_the_windows_mask(tmp_path, monkeypatch):
    """Through the tiny Wan on 8 devices: the windowed kernel's latents equal those of a
    run whose windowed calls are dense attention with the window's token mask; a run
    without the window differs (the window is in use)."""
    from support.runs import final_latents

    path = tmp_path / "windowed.yaml"
    path.write_text(WINDOWED)

    windowed = final_latents(path)

    def masked_dense(q, k, v, tiling, *, scale, **_):
        return kernels.reference(q, k, v, jnp.asarray(tiling.keep()), scale=scale)
    monkeypatch.setattr(window, "attend_windowed", masked_dense)
    masked = final_latents(path, "attention.block_q=256")  # another recipe: no trace of the first
    monkeypatch.undo()
    dense = final_latents(path, "attention.window=null")
    assert float((windowed - masked).abs().max()) <= 1e-5
    assert float((windowed - dense).abs().max()) > 1e-3


@pytest.mark.parametrize("window_yaml,path,said", [
    ("{tile: [1, 2, 2], reach: [1, 1, 1], global_frames: 1, dense_steps: 0}", None, None),
    ("{tile: [2, 2, 2], reach: [0, 0, 0], global_frames: 1}", "attention.window.global_frames",
     "not a multiple of the tile's 2 frames"),
    ("{tile: [1, 2, 2], reach: [0, 0, 0], dense_steps: 3}", "attention.window.dense_steps",
     "no step is windowed"),
    ("{tile: [1, 8, 2], reach: [0, 0, 0]}", "attention.window.tile",
     "8 height per tile, but the video has 4 token height (5x4x4 tokens)"),
    ("{tile: [2, 2, 2], reach: [2, 1, 1]}", "attention.window",
     "every tile sees every other (3x2x2 tiles"),
])
def test_validate_checks_the_window_against_the_video(tmp_path, window_yaml, path, said):
    from porter import registry as registry_mod, recipe
    from porter.port import checks

    file = tmp_path / "r.yaml"
    file.write_text(WINDOWED.replace(
        "{tile: [1, 2, 2], reach: [1, 1, 0], global_frames: 1, dense_steps: 1}", window_yaml))
    problems = checks.recipe_problems(recipe.load(file), registry_mod.loaded())
    if path is None:
        assert problems == []
        return
    [problem] = problems
    assert problem.path == path and said in problem.message, problem


@pytest.mark.parametrize("text,said", [
    ("model: {family: cogvideox, source: tiny}", "family 'cogvideox' does not window"),
    ("attention: {backend: null}", "set without attention.backend"),
    ("max_sequence_length: 80", "as many as the text's"),  # 5 x 4 x 4 video tokens
])
def test_a_window_where_it_cannot_run_is_refused(tmp_path, text, said):
    from porter import registry as registry_mod, recipe
    from porter.port import checks

    file = tmp_path / "r.yaml"
    if text.startswith("max_sequence_length"):
        body = WINDOWED.replace("max_sequence_length: 16", text)
    elif "backend" in text:
        body = WINDOWED.replace("  backend: auto\n", "  backend: null\n")
    else:
        body = WINDOWED.replace(
            "model: {family: wan, source: tiny}", text).replace(
            "frames: 17", "frames: 9").replace("height: 64, width: 64",
                                                "height: 32, width: 32")
    file.write_text(body)
    found = checks.recipe_problems(recipe.load(file), registry_mod.loaded())
    assert any(p.path == "attention.window" and said in p.message for p in found), found


@pytest.mark.parametrize("grid,reach,first,axes", [
    ((4, 8, 16), (1, 0, 0), 0, {"dp": 1}),           # 4 tiles of 128 tokens, banded
    ((3, 8, 20), (0, 0, 1), 1, {"dp": 2, "tp": 2}),  # padded columns; heads split
])
def test_splash_runs_the_window_with_its_block_mask(grid, reach, first, axes):
    """On TPU, splash takes the window's tiles as its blocks and skips the blocks the
    mask leaves out (here interpreted): equal to dense attention with the mask."""
    tiling = window.Tiling(grid, (1, 8, 16), reach, first)
    q, k, v = qkv(2, 2, tiling.tokens)
    expected = kernels.reference(q, k, v, jnp.asarray(tiling.keep()), scale=0.25)
    m = mesh(**axes)
    assert window.splash_fits(tiling, window.tile_layout(tiling, q.shape, m, "dp", "tp"))
    got = jax.jit(lambda q, k, v: window.attend_windowed(
        q, k, v, tiling, scale=0.25, mesh=m, data_axis="dp", head_axis="tp",
        backend=BACKENDS["splash"], platform="cpu"))(q, k, v)
    assert float(jnp.abs(got - expected).max()) <= TOLERANCE
    # the blocks splash visits are those the window keeps, each whole (no partial
    # block to mask within): what Porter counts as its FLOPs
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_mask as mask_lib,
    )
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_mask_info as info_lib,
    )
    info, _ = info_lib._process_mask(mask_lib.MultiHeadMask(
        [window.kernels._tile_mask_type()(tiling)]), (128, 128), is_dkv=False)
    blocks = np.asarray(info.block_mask)[0]
    assert (blocks == 2).sum() == tiling.seen.sum() and (blocks == 1).sum() == 0
    assert window.kernel_flops(tiling, q.shape, "splash") == 4 * 2 * 2 * 16 * \
        (blocks == 2).sum() * 128 ** 2


def test_the_attention_pass_sets_the_grid_around_a_transformers_calls_after_dense_steps(
        tmp_path):
    """The pass's call-time part: no grid around a call as a whole, nor in the window's
    dense steps (their programs are those of a port without a window); the video's
    grid in the later steps and around a transformer called by itself."""
    from porter import recipe as recipe_mod
    from porter import registry as registry_mod
    from porter.transforms.building import Ported
    from porter.runtime import trace_context
    from porter.transforms import Calling
    from porter.transforms import attention

    path = tmp_path / "windowed.yaml"
    path.write_text(WINDOWED)
    loaded = recipe_mod.load(path)
    registry = registry_mod.loaded()
    calling = Calling(loaded, registry, registry.family("wan"), None, Ported())

    def grid_at(step):
        context = attention.PASS.around(calling.at_step(step))
        if context is None:
            return None
        with context:
            return trace_context.VIDEO_GRID.get()

    assert grid_at(0) is None  # dense_steps: 1
    assert grid_at(1) == grid_at(None) == (5, 4, 4)
    assert trace_context.VIDEO_GRID.get() is None
