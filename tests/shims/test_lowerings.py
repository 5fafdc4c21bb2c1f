"""Porter's own lowerings (``porter.shims.lowerings``): PyTorch's results, and what they are
for (a group norm that keeps a split height and width split)."""

import jax
import numpy as np
import pytest
import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from packaging.requirements import Requirement

from porter.shims import lowerings
from porter.shims.compat import import_torchax

torchax = import_torchax()


def ported_group_norm(x, groups, weight, bias, ours: bool):
    """torch's group norm of a host tensor run through torchax, back on the host."""
    env = torchax.default_env()
    with env, (lowerings.installed(env) if ours else _nothing()):
        out = torch.nn.functional.group_norm(env.to_xla(x), groups,
                                             None if weight is None else env.to_xla(weight),
                                             None if bias is None else env.to_xla(bias))
        return torch.from_numpy(np.asarray(out.jax().astype("float32")))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("shape", [(2, 8, 5, 6), (1, 12, 3, 4, 6)])
@pytest.mark.parametrize("affine", [True, False])
def test_equals_pytorch_in_float32(shape, affine):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=generator) * 3 + 1
    weight = torch.randn(shape[1], generator=generator) if affine else None
    bias = torch.randn(shape[1], generator=generator) if affine else None
    expected = torch.nn.functional.group_norm(x, 4, weight, bias)
    got = ported_group_norm(x, 4, weight, bias, ours=True)
    assert (got - expected).abs().max() < 1e-5


def test_bfloat16_takes_its_statistics_in_float32_as_pytorch_does():
    generator = torch.Generator().manual_seed(1)
    x = (torch.randn(1, 8, 3, 16, 16, generator=generator) * 4 + 50).bfloat16()
    weight = torch.randn(8, generator=generator).bfloat16()
    bias = torch.randn(8, generator=generator).bfloat16()
    expected = torch.nn.functional.group_norm(x, 2, weight, bias).float()
    ours = ported_group_norm(x, 2, weight, bias, ours=True)
    assert (ours - expected).abs().max() <= 2 * 2 ** -7 * expected.abs().max()


def test_a_split_height_and_width_stay_split():
    """Compiled for 8 devices with the activations split over height and width, as a
    VAE recipe splits them: torchax's flattening gathers whole frames on every device,
    Porter's lowering does not."""
    env = torchax.default_env()
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("dp", "tp"))
    spec = NamedSharding(mesh, PartitionSpec(None, None, None, "dp", "tp"))
    x = jax.ShapeDtypeStruct((1, 64, 4, 64, 128), jax.numpy.float32, sharding=spec)

    def temporaries(ours: bool) -> int:
        def norm(array):
            with env, (lowerings.installed(env) if ours else _nothing()):
                out = torch.nn.functional.group_norm(torchax.interop.torch_view(array), 32)
                return torchax.interop.jax_view(out)
        compiled = jax.jit(norm, out_shardings=spec).lower(x).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    whole = 1 * 64 * 4 * 64 * 128 * 4  # one full activation, float32
    assert temporaries(ours=False) >= whole  # torchax: at least one whole copy
    assert temporaries(ours=True) <= whole // 4


def test_installed_for_the_block_only_and_for_these_torchax_versions():
    env = torchax.default_env()
    before = env._ops.get(torch.ops.aten.native_group_norm)
    with lowerings.installed(env):
        assert env._ops[torch.ops.aten.native_group_norm].func is lowerings.group_norm
    assert env._ops.get(torch.ops.aten.native_group_norm) is before
    from importlib.metadata import version
    assert Requirement(lowerings.FITS).specifier.contains(version("torchax"))


def test_a_device_tensor_is_indexed_with_host_index_tensors_as_in_pytorch():
    table = torch.arange(10) * 3
    rows = torch.tensor([0, 4, 4, 9])  # made on the host, as a pipeline's loop does
    env = torchax.default_env()
    with env:
        device_table = env.to_xla(table)
        with pytest.raises(AssertionError, match="Expect a Tensor or a View"):
            device_table[rows]  # torchax alone
        with lowerings.installed(env):
            picked = device_table[rows]
            one = device_table[torch.tensor(2)]
            sliced = device_table[2:5]
        assert env._ops[torch.Tensor.__getitem__].func.__name__ == "getitem"  # torchax's again
    assert picked.jax().tolist() == table[rows].tolist()
    assert int(one.jax()) == 6 and sliced.jax().tolist() == [6, 9, 12]


def test_attention_rows_with_every_key_masked_are_zero_as_in_pytorch():
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=generator) for _ in range(3))
    causal_padded = torch.tril(torch.ones(3, 3, dtype=torch.bool))
    causal_padded[:, 0] = False  # a left-padded first token: row 0 attends to nothing
    additive = torch.zeros(3, 3).masked_fill(~causal_padded, float("-inf"))
    env = torchax.default_env()
    for mask in (causal_padded, additive):
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        with env:
            args = env.to_xla((q, k, v, mask))
            plain = torch.nn.functional.scaled_dot_product_attention(*args[:3],
                                                                     attn_mask=args[3])
            assert np.isnan(np.asarray(plain.jax())).any()  # torchax alone
            with lowerings.installed(env):
                ours = torch.nn.functional.scaled_dot_product_attention(*args[:3],
                                                                        attn_mask=args[3])
        np.testing.assert_allclose(np.asarray(ours.jax()), expected.numpy(), atol=1e-6)


@pytest.mark.parametrize("write", [
    lambda t, a: t[:, 0::2].addcmul_(a, a, value=0.5),
    lambda t, a: t[:, 1::2].masked_fill_(a > 1, -1.0),
    lambda t, a: t[1:].zero_(),
    lambda t, a: t[:, :2].lerp_(a, 0.25),
    lambda t, a: t[0].fill_(7.0),
])
def test_in_place_operations_write_through_views_as_in_pytorch(write):
    a = torch.arange(4.0).reshape(2, 2)
    expected = torch.ones(2, 4)
    write(expected, a)
    env = torchax.default_env()
    with env:
        plain = env.to_xla(torch.ones(2, 4))
        write(plain, env.to_xla(a))
        with lowerings.installed(env):
            ours = env.to_xla(torch.ones(2, 4))
            write(ours, env.to_xla(a))
        assert plain.cpu().tolist() == torch.ones(2, 4).tolist()  # torchax: lost
        assert ours.cpu().tolist() == expected.tolist()


def test_a_slice_with_tensor_bounds_is_sliced_at_their_values():
    alphas = torch.linspace(0.1, 0.9, 9)
    env = torchax.default_env()
    with env:
        values = env.to_xla(alphas)
        t0, t1 = env.to_xla((torch.tensor(2), torch.tensor(6)))
        with pytest.raises(AssertionError, match="within the torchax environment"):
            torch.prod(values[t0:t1]).cpu()  # torchax alone
        with lowerings.installed(env):
            product = torch.prod(values[t0:t1]).cpu()
    assert torch.allclose(product, torch.prod(alphas[2:6]))


def test_a_tensor_check_runs():
    env = torchax.default_env()
    with env:
        ok, bad = env.to_xla((torch.ones(3, dtype=torch.bool), torch.tensor([True, False])))
        with pytest.raises(Exception, match="_is_all_true"):
            torch._check_tensor_all(ok)  # torchax alone: no lowering
        with lowerings.installed(env):
            torch._check_tensor_all(ok)
            with pytest.raises(RuntimeError, match="Expected"):
                torch._check_tensor_all(bad)


def test_a_host_tensor_is_made_from_device_scalars_as_in_pytorch():
    """The Euler scheduler's Karras timesteps (Stable Video Diffusion):
    ``torch.Tensor([0.25 * sigma.log() for sigma in sigmas])`` with sigmas on the device."""
    sigmas = torch.tensor([14.6, 2.0, 0.5])
    env = torchax.default_env()
    with env:
        device = env.to_xla(sigmas)
        with pytest.raises(RuntimeError, match="meta tensors"):
            torch.Tensor([0.25 * s.log() for s in device])  # torchax alone
        with lowerings.installed(env):
            made = torch.Tensor([0.25 * s.log() for s in device])
            counts = [int(n) for n in env.to_xla(torch.tensor([3, 4]))]
    assert type(made) is torch.Tensor and made.device.type == "cpu"
    assert torch.allclose(made, torch.Tensor([0.25 * s.log() for s in sigmas]))
    assert counts == [3, 4]


@pytest.mark.parametrize("periodic", [True, False])
@pytest.mark.parametrize("length", [0, 1, 2, 7])
def test_a_hann_window_is_pytorchs(periodic, length):
    env = torchax.default_env()
    with env:
        with lowerings.installed(env):
            made = torch.hann_window(length, periodic=periodic, device="jax")
        made = np.asarray(made.jax())
    assert np.allclose(made, torch.hann_window(length, periodic=periodic).numpy(), atol=1e-6)


def test_cumsum_in_place_runs_and_writes_through_a_view():
    """Kandinsky 6 SR's NABLA mask: ``vals.cumsum_(-1)``, which torchax cannot run."""
    expected = torch.arange(8.0).reshape(2, 4)
    expected[:, 1:].cumsum_(-1)
    env = torchax.default_env()
    with env:
        values = env.to_xla(torch.arange(8.0).reshape(2, 4))
        with pytest.raises(Exception, match="cumsum_"):
            values.clone().cumsum_(-1)  # torchax alone
        with lowerings.installed(env):
            values[:, 1:].cumsum_(-1)
        assert values.cpu().tolist() == expected.tolist()


# (input shape, interpolate's keywords): integer factors (broadcast), sizes and factors
# that are not (taken along the axis), both overloads (scale_factor / size)
UPSAMPLES = [
    ((1, 3, 4, 5, 6), dict(scale_factor=2)),
    ((1, 3, 4, 5, 6), dict(scale_factor=(1, 2, 2))),
    ((1, 3, 4, 5, 6), dict(size=(4, 10, 18))),
    ((1, 3, 4, 5, 6), dict(size=(7, 9, 11))),
    ((1, 3, 4, 5, 6), dict(scale_factor=(1.5, 2.5, 0.5))),
    ((2, 3, 5, 7), dict(scale_factor=3)),
    ((2, 3, 5, 7), dict(size=(13, 3))),
    ((2, 3, 7), dict(scale_factor=1.7)),
]


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize("shape,keywords", UPSAMPLES)
def test_nearest_upsampling_is_pytorchs(shape, keywords, mode):
    x = torch.randn(shape)
    expected = torch.nn.functional.interpolate(x, mode=mode, **keywords)
    env = torchax.default_env()
    with env, lowerings.installed(env):
        got = torch.nn.functional.interpolate(env.to_xla(x), mode=mode, **keywords)
        got = torch.from_numpy(np.asarray(got.jax()))
    assert torch.equal(got, expected)


def test_integer_upsampling_is_no_gather():
    """A VAE's 2x upsampling: broadcast and reshape, which a split width keeps split
    (PyTorch's decomposition, which torchax runs, gathers every output element)."""
    env = torchax.default_env()
    x = jax.ShapeDtypeStruct((1, 8, 3, 16, 16), "float32")

    def program(ours: bool) -> str:
        def upsample(a):  # a new function each time: jax.jit caches traces per function
            return torch.nn.functional.interpolate(
                torchax.interop.torch_view(a), scale_factor=(1, 2, 2), mode="nearest").jax()
        with env, (lowerings.installed(env) if ours else _nothing()):
            return jax.jit(upsample).lower(x).as_text()

    assert "gather" in program(ours=False)
    assert "gather" not in program(ours=True)


def test_nearest_upsampling_overloads_as_pytorch_calls_them():
    """The default overload with its per-axis scales by keyword, and ``.out``, which
    stays with torchax's decomposition."""
    x = torch.randn(1, 2, 5, 7)
    expected = torch.ops.aten.upsample_nearest2d.default(x, [10, 21], scales_h=2.0,
                                                         scales_w=3.0)
    env = torchax.default_env()
    with env, lowerings.installed(env):
        on_device = env.to_xla(x)
        got = torch.ops.aten.upsample_nearest2d.default(on_device, [10, 21], scales_h=2.0,
                                                        scales_w=3.0)
        out = env.to_xla(torch.empty(1, 2, 10, 21))
        torch.ops.aten.upsample_nearest2d.out(on_device, [10, 21], out=out)
        got, out = (torch.from_numpy(np.asarray(t.jax())) for t in (got, out))
    assert torch.equal(got, expected) and torch.equal(out, expected)


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_of_a_number_is_pytorchs(right):
    """The DPM-Solver scheduler's ``torch.searchsorted(torch.flip(lambda_t, [0]),
    lambda_min_clipped)`` with its tables on the device (Wan Animate 2)."""
    table = torch.tensor([0.0, 1.0, 2.0, 2.0, 3.0])
    env = torchax.default_env()
    with env:
        device = env.to_xla(table)
        with pytest.raises(Exception, match="searchsorted.Scalar"):
            torch.searchsorted(device, 2.0)  # torchax alone
        with lowerings.installed(env):
            found = [int(torch.searchsorted(device, value, right=right))
                     for value in (-1.0, 2.0, 2.5, 9.0)]
    assert found == [int(torch.searchsorted(table, value, right=right))
                     for value in (-1.0, 2.0, 2.5, 9.0)]
