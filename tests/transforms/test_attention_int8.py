"""int8 attention (Pallas, int8 Q.K^T): interpreted on the CPU against float32
attention, compiled by Mosaic for a TPU at Wan 14B's real length, and a tiny Wan
verified with it."""

import jax
import jax.numpy as jnp
import pytest

from porter import cli
from porter.transforms.attention import int8, kernels

from support import RECIPES
from support.aot import needs_libtpu
from support.attention import compiled_attention, compiled_wan14b_720p, inputs

# Relative L2 error against float32 attention that int8 attention may not exceed
# (docs/recipes.md, "Attention"); measured at these shapes: 0.014 (unit normals),
# 0.060 self and 0.050 cross (peaked rows, keys offset); bfloat16 inputs throughout.
BOUNDS = {"random": 0.03, "peaked": 0.08}


@pytest.mark.parametrize("kind", sorted(BOUNDS))
@pytest.mark.parametrize("q_len,k_len", [(700, 700), (300, 77)], ids=["self", "cross"])
def test_int8_attention_error_stays_within_its_bound(kind, q_len, k_len):
    """Padded to blocks of 256 (the last key block's padding masked), interpreted."""
    q, k, v = inputs(kind, q_len, k_len, dim=128)
    scale = 128 ** -0.5
    expected = kernels.reference(*(x.astype(jnp.float32) for x in (q, k, v)), None,
                                 scale=scale)
    got = int8.int8_pallas(q, k, v, None, scale=scale, block_q=256, block_kv=256,
                           platform="cpu").astype(jnp.float32)
    error = float(jnp.linalg.norm((got - expected).ravel())
                  / jnp.linalg.norm(expected.ravel()))
    assert got.shape == expected.shape and error <= BOUNDS[kind], error


def test_quantized_blocks_round_trip_within_half_a_step():
    x = jax.random.normal(jax.random.key(3), (2, 512, 64)) * 3
    values, scales = int8.quantized(x, 128)
    assert values.dtype == jnp.int8 and scales.shape == (8,)
    back = values.astype(jnp.float32).reshape(2, 4, 128, 64) * scales.reshape(2, 4, 1, 1)
    assert float(jnp.abs(back.reshape(x.shape) - x).max()) <= float(scales.max()) / 2 + 1e-6


@needs_libtpu
@pytest.mark.parametrize("target", ["v6e-8", "v5e-8"])
def test_int8_attention_compiles_as_a_mosaic_kernel_at_a_real_length(target):
    """Wan 14B's 720p self-attention (75,600 tokens, 40 heads of 128) on a v6e-8 and a
    v5e-8, batch on dp and heads on tp: Mosaic's custom call with int8 operands, small
    temporaries, and half its FLOPs (Q.K^T) counted as int8 matmuls."""
    from porter.aot import hlo

    compiled, flops = compiled_wan14b_720p(target, backend="int8")
    text = compiled.as_text()
    assert hlo.opaque_kernels(text) >= 1 and "s8[" in text
    assert compiled.memory_analysis().temp_size_in_bytes < 2**30
    dense = 4 * 2 * 40 * 75600 * 75600 * 128 / 8
    assert flops == [dense] and flops.matmuls == {"int8": dense / 2}


@needs_libtpu
def test_a_window_runs_int8_attention_compiled_by_mosaic():
    """Wan 1.3B's 480p self-attention (both guidance passes, 12 heads), each frame seeing
    the two frames either side and the first: int8's own kernel on each group of query
    frames and the keys they see, Mosaic's custom calls with int8 operands, the FLOPs
    counted those of the window's pairs (27% of dense here), their Q.K^T as int8."""
    from types import SimpleNamespace

    from porter.aot import hlo
    from porter.transforms.attention import window

    shape, grid = (2, 12, 32760, 128), (21, 30, 52)
    section = SimpleNamespace(tile=[1, 30, 52], reach=[2, 0, 0], global_frames=1)
    compiled, flops = compiled_attention("v6e-8", shape, grid, "int8", section)
    text = compiled.as_text()
    tiling = window.Tiling(grid, (1, 30, 52), (2, 0, 0), 1)
    assert hlo.opaque_kernels(text) == len(tiling.groups) and "s8[" in text
    windowed = window.kernel_flops(tiling, shape, "gathered") / 8
    assert flops == [windowed] and flops.matmuls == {"int8": windowed / 2}
    assert 0.26 < windowed * 8 / (4 * 2 * 12 * 32760 ** 2 * 128) < 0.30


@pytest.mark.slow
def test_verify_holds_a_tiny_wan_with_int8_attention_to_its_bound(capsys):
    assert cli.main(["verify", str(RECIPES / "wan-tiny.yaml"), "--json",
                     "attention.backend=int8"]) == 0
    import json
    found = json.loads(capsys.readouterr().out)
    assert found["tolerance"] == int8.TOLERANCE and found["ok"], found
