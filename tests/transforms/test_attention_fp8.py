"""fp8 attention: the arithmetic of cuDNN's fp8 kernel, written out in XLA
(``fp8-emulated``), measured against float32 attention on the CPU; the kernel itself
runs only on a Hopper GPU (benchmarks/gpu/attention.py compares the two there)."""

import json

import jax.numpy as jnp
import pytest

from porter import cli
from porter.transforms.attention import fp8, kernels

from support import RECIPES
from support.attention import inputs

# Relative L2 error against float32 attention, and the cosine, that fp8 attention may
# not exceed (docs/recipes.md, "Attention"). Measured here at this test's shape:
# 0.060 / 0.998 (unit normals), 0.148 / 0.989 (peaked); cuDNN's kernel on an H100 at
# Wan 1.3B's 32,760 tokens: 0.060 / 0.998 and 0.187 / 0.982.
BOUNDS = {"random": (0.08, 0.997), "peaked": (0.25, 0.975)}


@pytest.mark.parametrize("kind", sorted(BOUNDS))
def test_fp8_attention_error_stays_within_its_bound(kind):
    q, k, v = inputs(kind)
    scale = 64 ** -0.5
    exact = kernels.reference(*(x.astype(jnp.float32) for x in (q, k, v)), scale=scale)
    got = fp8.emulated(q, k, v, scale=scale).astype(jnp.float32)
    relative = float(jnp.linalg.norm(got - exact) / jnp.linalg.norm(exact))
    cosine = float(jnp.sum(got * exact) / (jnp.linalg.norm(got) * jnp.linalg.norm(exact)))
    bound, least_cosine = BOUNDS[kind]
    assert relative <= bound and cosine >= least_cosine, (relative, cosine)
    bf16 = kernels.reference(q, k, v, scale=scale).astype(jnp.float32)
    assert float(jnp.linalg.norm(bf16 - exact) / jnp.linalg.norm(exact)) < relative / 10


def test_smoothing_the_keys_leaves_attention_unchanged():
    q, k, v = (x.astype(jnp.float32) for x in inputs("peaked", k_len=300))
    plain = kernels.reference(q, k, v, scale=0.125)
    smoothed = kernels.reference(q, fp8.smoothed(k), v, scale=0.125)
    assert float(jnp.abs(plain - smoothed).max()) < 1e-4
    # and the keys' range, which sets the quantization step, shrinks
    assert float(jnp.abs(fp8.smoothed(k)).max()) < float(jnp.abs(k).max())


def test_a_masked_key_gets_no_weight():
    q, k, v = inputs("random", k_len=64)
    keep = (jnp.arange(64) < 40)[None, None, None, :]
    moved = v.at[:, :, 40:].set(100.0)  # values of masked keys: must not show
    a = fp8.emulated(q, k, v, keep, scale=0.125)
    b = fp8.emulated(q, k, moved, keep, scale=0.125)
    # v's scale changes with its largest value, so compare at fp8's resolution
    assert float(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)).max()) < 0.5


def test_cudnn_fp8_is_refused_where_it_cannot_run(capsys):
    assert cli.main(["validate", str(RECIPES / "wan-tiny.yaml"),
                     "attention.backend=cudnn-fp8"]) == 2
    assert "backend 'cudnn-fp8' does not run on cpu (runs on gpu)" in capsys.readouterr().err


def test_cudnn_fp8_is_refused_on_a_gpu_before_hopper():
    """Checked against the devices JAX started with: an Ampere GPU would fail only
    when the program compiles."""
    from types import SimpleNamespace

    from porter import registry as registry_mod, recipe
    from porter.transforms import attention

    loaded = recipe.load(RECIPES / "wan-tiny.yaml", ["attention.backend=cudnn-fp8"])
    registry = registry_mod.loaded()

    def problems(capability):
        device = SimpleNamespace(compute_capability=capability, device_kind="NVIDIA A100")
        return attention.platform_problems(loaded, registry, "gpu", device)
    [problem] = problems("8.0")
    assert problem.path == "attention.backend" and "needs compute capability 9.0 " \
        "(Hopper) or later; NVIDIA A100 has 8.0" in problem.message
    assert problems("9.0") == problems("10.0") == []


def test_verify_measures_a_port_with_fp8_attention_against_its_bound(capsys):
    assert cli.main(["verify", str(RECIPES / "wan-tiny.yaml"), "--json",
                     "attention.backend=fp8-emulated"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tolerance"] == fp8.TOLERANCE and result["ok"]
    # fp8 attention is an approximation: float32's own bound (1e-5) would refuse it
    assert 1e-3 < result["output"]["max_rel"] < fp8.TOLERANCE


def test_cross_attention_takes_its_own_backend(capsys):
    """``attention.cross_backend`` runs the calls whose keys are of another length (the
    tiny Wan's video tokens to its text): fp8 there and not in self-attention moves the
    output off float32's bound; validate refuses what cannot run."""
    tiny = str(RECIPES / "wan-tiny.yaml")
    assert cli.main(["verify", tiny, "--json", "attention.backend=blockwise",
                     "attention.cross_backend=fp8-emulated"]) == 0
    crossed = json.loads(capsys.readouterr().out)
    assert crossed["tolerance"] == fp8.TOLERANCE  # the widest backend's bound
    # blockwise alone is float32-exact (test_attention.py): the error is fp8's, in
    # cross-attention only
    assert 1e-4 < crossed["output"]["max_rel"] < fp8.TOLERANCE
    for overrides, said in (
            (["attention.cross_backend=reference"], "set without attention.backend"),
            (["attention.backend=auto", "attention.cross_backend=cudnn-fp8"],
             "attention.cross_backend: backend 'cudnn-fp8' does not run on cpu"),
            (["attention.backend=auto", "attention.cross_backend=blockwyse"],
             "did you mean 'blockwise'?")):
        assert cli.main(["validate", tiny, *overrides]) == 2
        assert said in capsys.readouterr().err
