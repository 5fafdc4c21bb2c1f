"""Attention backends: equal to reference, exact masks, sharded, bounded memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from porter import registry as registry_mod, recipe, runtime
from porter.transforms import attention
from porter.transforms.attention import kernels, sharded

# float32 on CPU; the kernels sum in a different order than reference
TOLERANCE = 2e-5
BACKENDS = ["blockwise", "splash", "torch_cpu"]  # kernel function names


def qkv(batch, heads, q_len, k_len, dim=32, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(keys[0], (batch, heads, q_len, dim)),
            jax.random.normal(keys[1], (batch, heads, k_len, dim)),
            jax.random.normal(keys[2], (batch, heads, k_len, dim)))


def key_padding(batch, k_len, lengths):
    return (jnp.arange(k_len)[None, :] < jnp.array(lengths)[:, None])[:, None, None, :]


SHAPES = {"self": (2, 3, 300, 300), "cross": (2, 3, 300, 77)}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["self", "cross"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_backend_equals_reference(backend, kind, masked):
    batch, heads, q_len, k_len = SHAPES[kind]
    q, k, v = qkv(batch, heads, q_len, k_len)
    keep = key_padding(batch, k_len, [k_len - 20, k_len // 2]) if masked else None
    scale = 32 ** -0.5
    expected = kernels.reference(q, k, v, keep, scale=scale)
    got = getattr(kernels, backend)(q, k, v, keep, scale=scale, block_q=128, block_kv=128)
    assert float(jnp.abs(got - expected).max()) <= TOLERANCE


def test_blockwise_general_mask_and_empty_rows():
    q, k, v = qkv(1, 2, 100, 90)
    keep = jax.random.bernoulli(jax.random.key(7), 0.6, (1, 2, 100, 90))
    keep = keep.at[:, :, 5, :].set(False)  # a query that may see nothing
    expected = kernels.reference(q, k, v, keep, scale=0.2)
    got = kernels.blockwise(q, k, v, keep, scale=0.2, block_q=32, block_kv=32)
    assert float(jnp.abs(got - expected).max()) <= TOLERANCE
    assert float(jnp.abs(got[:, :, 5]).max()) == 0.0


def test_torch_cpu_general_mask_empty_rows_and_bfloat16():
    q, k, v = qkv(1, 2, 100, 90)
    keep = jax.random.bernoulli(jax.random.key(7), 0.6, (1, 2, 100, 90))
    keep = keep.at[:, :, 5, :].set(False)
    expected = kernels.reference(q, k, v, keep, scale=0.2)
    got = jax.jit(lambda q, k, v, keep: kernels.torch_cpu(q, k, v, keep, scale=0.2))(
        q, k, v, keep)
    assert float(jnp.abs(got - expected).max()) <= TOLERANCE
    assert float(jnp.abs(got[:, :, 5]).max()) == 0.0
    half = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    got16 = kernels.torch_cpu(*half, scale=0.2)
    assert got16.dtype == jnp.bfloat16
    expected16 = kernels.reference(*half, scale=0.2).astype(jnp.float32)
    assert float(jnp.abs(got16.astype(jnp.float32) - expected16).max()) <= 2e-2


def test_exact_masking_beats_zeroing_keys_and_values():
    """A zeroed padding key still scores 0 and takes softmax mass; ours gives it none."""
    q, k, v = qkv(1, 2, 16, 40)
    valid = 25
    keep = key_padding(1, 40, [valid])
    exact = kernels.reference(q[:, :, :, :], k[:, :, :valid], v[:, :, :valid], scale=0.2)
    zeroed = kernels.reference(q, k.at[:, :, valid:].set(0), v.at[:, :, valid:].set(0),
                               scale=0.2)
    assert float(jnp.abs(zeroed - exact).max()) > 1e-2  # the approximation is visibly off
    for backend in ["reference"] + BACKENDS:
        got = getattr(kernels, backend)(q, k, v, keep, scale=0.2, block_q=128, block_kv=128)
        assert float(jnp.abs(got - exact).max()) <= TOLERANCE, backend


def mesh(**axes):
    devices = np.array(jax.devices()[: int(np.prod(list(axes.values())))])
    return jax.sharding.Mesh(devices.reshape(tuple(axes.values())), tuple(axes))


@pytest.mark.parametrize("axes,heads,expect", [
    ({"dp": 2, "tp": 4}, 8, ("dp", "tp", None)),     # heads split
    ({"dp": 2, "tp": 4}, 3, ("dp", None, "tp")),     # 3 heads on 4: sequence-parallel
    ({"tp": 8}, 12, (None, None, "tp")),             # Wan 1.3B: 12 heads on 8 devices
])
def test_sharded_attention_equals_unsharded(axes, heads, expect):
    m = mesh(**axes)
    q, k, v = qkv(2, heads, 256, 96)
    keep = key_padding(2, 96, [90, 60])
    assert sharded.layout(m, q.shape, "dp", "tp") == expect
    expected = kernels.reference(q, k, v, keep, scale=0.1)
    for kernel in (kernels.reference, kernels.blockwise, kernels.splash, kernels.torch_cpu):
        got = jax.jit(lambda q, k, v, keep: sharded.run(
            kernel, m, q, k, v, keep, data_axis="dp", head_axis="tp", scale=0.1,
            block_q=128, block_kv=128))(q, k, v, keep)
        assert float(jnp.abs(got - expected).max()) <= TOLERANCE, kernel.__name__


def test_torch_sdpa_is_replaced_with_exact_masks(write):
    """Through torchax: torch's own CPU SDPA is the reference."""
    from porter.shims.interop import to_device, to_host

    from support import TINY_RECIPE

    loaded = recipe.load(write("r.yaml", TINY_RECIPE + "attention: {backend: blockwise, "
                               "block_q: 64, block_kv: 64}\nmesh: {dp: 1}\n"))
    rt, registry = runtime.start(loaded), registry_mod.loaded()
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, n, 16, generator=generator) for n in (100, 70, 70))
    mask = torch.arange(70)[None, None, None, :] < torch.tensor([70, 33])[:, None, None, None]
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    settings = attention.AttentionSettings.of(loaded, registry, rt)
    with attention.installed(rt.env, settings), rt.env:
        got = torch.nn.functional.scaled_dot_product_attention(
            to_device(q, rt), to_device(k, rt), to_device(v, rt),
            attn_mask=to_device(mask, rt))
        causal = torch.nn.functional.scaled_dot_product_attention(
            to_device(q, rt), to_device(q, rt), to_device(q, rt), is_causal=True)
    assert (to_host(got) - expected).abs().max() <= TOLERANCE
    expected_causal = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert (to_host(causal) - expected_causal).abs().max() <= TOLERANCE
    # undone: torchax's own lowering is back
    assert rt.env._ops[torch.nn.functional.scaled_dot_product_attention].is_user_defined \
        is False


def temp_bytes(kernel, q_len, heads=2, dim=64):
    shape = jax.ShapeDtypeStruct((1, heads, q_len, dim), jnp.float32)
    compiled = jax.jit(lambda q, k, v: kernel(q, k, v, None, scale=0.125, block_q=512,
                                              block_kv=512)).lower(shape, shape, shape).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_blockwise_memory_stays_bounded_at_long_sequences():
    """16k tokens: reference needs the whole score matrix, blockwise a few blocks."""
    tokens = 16384
    scores = 2 * tokens * tokens * 4  # 2 heads, float32: 2 GiB
    reference = temp_bytes(kernels.reference, tokens)
    blockwise = temp_bytes(kernels.blockwise, tokens)
    assert reference >= scores
    assert blockwise <= 64 * 2**20, f"{blockwise / 2**20:.0f} MiB"
    # and doubling the sequence does not double blockwise's working memory
    assert temp_bytes(kernels.blockwise, 2 * tokens) <= 2 * 64 * 2**20


def test_auto_choice():
    registry = {b.name: b for b in attention.BUILTIN}
    from porter.transforms.attention.backends import choose
    assert choose("auto", "tpu", 10, 10, registry).name == "splash"
    assert choose("auto", "gpu", 10, 10, registry).name == "cudnn"
    assert choose("auto", "cpu", 100, 100, registry).name == "reference"
    # Wan cross-attention (2k video tokens to 512 text tokens, 12 heads): 51 MiB of
    # scores, stays in XLA; self-attention at 2k tokens: 0.2 GiB, PyTorch's kernel
    assert choose("auto", "cpu", 2080, 512, registry, batch_heads=12).name == "reference"
    assert choose("auto", "cpu", 2080, 2080, registry, batch_heads=12).name == "torch-cpu"
    assert choose("splash", "cpu", 1, 1, registry).name == "splash"


def test_auto_asks_the_backends_so_a_plugins_backend_can_be_chosen():
    """A backend declares where auto may pick it and whether it materialises every
    score; the choice and the memory checks read that, not names."""
    from porter.transforms.attention.backends import AttentionBackend, choose, materialises

    mine = AttentionBackend("my-tpu-kernel", kernels.blockwise, "a plugin's kernel",
                            platforms=("tpu",), auto={"tpu": 20})
    dense = AttentionBackend("my-dense", kernels.reference, "every score",
                             materialises=True)
    registry = {b.name: b for b in (*attention.BUILTIN, mine, dense)}
    assert choose("auto", "tpu", 10, 10, registry).name == "my-tpu-kernel"
    assert choose("auto", "gpu", 10, 10, registry).name == "cudnn"
    assert materialises("my-dense", registry) and materialises("reference", registry)
    assert materialises(None, registry)  # torchax's own lowering
    assert not materialises("my-tpu-kernel", registry) and not materialises("auto", registry)
    with pytest.raises(LookupError):
        choose("auto", "cpu", 10, 10, {"my-tpu-kernel": mine})


def test_splash_on_a_sharded_tpu_mesh_needs_its_axes(capsys):
    """Splash is a Mosaic kernel: on a tp mesh with no head axis said, the TPU compile
    stops at "Mosaic kernels cannot be automatically partitioned"; validate says so
    first, for the TPU it checks for (on a CPU, auto runs a kernel XLA partitions)."""
    from porter import cli
    from support import RECIPES

    ltx23 = str(RECIPES / "ltx23.yaml")
    unsaid = "attention.head_axis=null"  # the recipe says it: take it away
    assert cli.main(["validate", ltx23, "--target", "v6e-8", unsaid]) == 2
    said = capsys.readouterr().err
    assert "'auto' runs splash, a Mosaic kernel, on a TPU mesh dp=1 x tp=8" in said
    assert "attention.head_axis: tp" in said
    assert cli.main(["validate", ltx23, "--target", "v6e-8"]) == 0
    assert cli.main(["validate", ltx23, "--devices", "8", unsaid]) == 0
    # splash named on a CPU runs interpreted, which XLA partitions by itself
    assert cli.main(["validate", ltx23, "--devices", "8", unsaid,
                     "attention.backend=splash", "runtime.platform=cpu"]) == 0
