"""Porter's own lowerings (``porter.lowerings``): PyTorch's results, and what they are
for (a group norm that keeps a split height and width split)."""

import jax
import numpy as np
import pytest
import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from packaging.requirements import Requirement

from porter import lowerings
from porter.compat import import_torchax

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
