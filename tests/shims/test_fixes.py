"""Where torchax does not behave as PyTorch does, fixed on every run (``porter.shims.fixes``):
each test shows the gap without the fix, then PyTorch's result with it."""

import copy

import pytest
import torch

from porter import registry as registry_mod
from porter.recipe.schema import CompileRule
from porter.shims.compat import import_torchax
from porter.transforms import jit
from porter.transforms import patches
from porter.transforms.patches import applied

from support.references import Positions


@pytest.fixture
def env():
    return import_torchax().default_env()


def core(name):
    return [(registry_mod.loaded().patches[name], {})]


def test_deepcopy_of_a_scheduler_inside_the_environment(env):
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler()
    scheduler.set_timesteps(4)
    with env, pytest.raises(Exception, match="set_.source_Storage"):
        copy.deepcopy(scheduler)  # the gap: no lowering for the storage swap
    with applied(core("core.deepcopy")), env:
        copied = copy.deepcopy(scheduler)
        on_device = torch.arange(3, device="jax")
        twin = copy.deepcopy(on_device)
        assert twin is not on_device and torch.equal(twin.cpu(), on_device.cpu())
    assert copied is not scheduler and type(copied.timesteps) is torch.Tensor
    assert torch.equal(copied.timesteps, scheduler.timesteps)
    assert copied.timesteps.data_ptr() != scheduler.timesteps.data_ptr()


def test_list_indexing_of_a_view(env):
    with env:
        values = torch.arange(10, device="jax")
        with pytest.raises(AttributeError, match="_elem"):
            values[:5][[0, -1]]  # the gap
    with applied(core("core.view_index")), env:
        picked = values[:5][[0, -1]].cpu().tolist()
        by_tensor = values[2:8][torch.tensor([0, 2], device="jax")].cpu().tolist()
        narrowed = values[:5][1:3]
        assert type(narrowed).__name__ == "View"  # slices of a view stay views
        narrowed = narrowed.cpu().tolist()
    assert (picked, by_tensor, narrowed) == ([0, 4], [2, 4], [1, 2])


def test_a_view_as_a_list(env):
    with env:
        grid = torch.tensor([[3, 4, 5]], device="jax")
        with pytest.raises(RuntimeError, match="tensor subclasses"):
            grid[0].tolist()  # the gap (Wan Animate 2's grid sizes)
    with applied(core("core.view_tolist")), env:
        assert grid[0].tolist() == [3, 4, 5] and grid.tolist() == [[3, 4, 5]]


def test_an_assignment_into_a_view_of_a_view_reaches_the_tensor(env):
    """Wan Animate 2's attention packs its tokens: packed[:, :n].view(...)[:, :, :k] = q."""

    def pack(packed, tokens):
        packed[:, 0:6].view(1, 2, 3, 2, 3)[:, :, :2] = tokens
        return packed

    tokens = torch.randn(1, 2, 2, 2, 3)
    expected = pack(torch.zeros(1, 10, 2, 3), tokens)
    with env:
        gap = pack(torch.zeros(1, 10, 2, 3, device="jax"), env.to_xla(tokens))
        assert not torch.equal(gap.cpu(), expected)  # the gap: the write is lost
    with applied(core("core.view_of_view")), env:
        packed = pack(torch.zeros(1, 10, 2, 3, device="jax"), env.to_xla(tokens))
        read = torch.arange(60.0, device="jax").reshape(1, 10, 2, 3)[:, 2:8].view(1, 2, 18)
        assert torch.equal(packed.cpu(), expected)
        assert torch.equal(read.cpu(), torch.arange(60.0).reshape(1, 10, 2, 3)[:, 2:8]
                           .reshape(1, 2, 18))
        assert read[:, 1].view(-1).shape == (18,)
        with pytest.raises(RuntimeError, match="invalid for input of size 36"):
            read.view(5, 5)  # at the call, as PyTorch says it


def test_type_as_makes_a_new_tensor_and_takes_a_view(env):
    with env:
        x = torch.ones(2, 3, device="jax")
        half = torch.zeros(2, 3, dtype=torch.float16, device="jax")
        with pytest.raises(AttributeError, match="_elem"):
            x.type_as(half[:, :1])  # the gap: a view has no array
        x.type_as(half)
        assert x.dtype == torch.float16  # the gap: torchax cast x itself
    with applied(core("core.type_as")), env:
        x = torch.ones(2, 3, device="jax")
        cast = x.type_as(half[:, :1])
        assert (cast.dtype, x.dtype) == (torch.float16, torch.float32)
        assert x.type_as(x) is x
        assert cast.cpu().tolist() == [[1.0] * 3] * 2


def test_a_host_tensor_crosses_into_a_compiled_program(env, monkeypatch):
    from porter.shims import fixes as torchax_fixes

    def compiled():
        with env:
            return jit.apply(Positions().to("jax"),
                                           CompileRule(methods=["forward"]))

    expected = Positions()(torch.ones(4), torch.arange(4.0)).detach()
    module = compiled()
    with env:
        got = module(torch.ones(4, device="jax"), torch.arange(4.0))  # no device given
        assert torch.equal(got.cpu(), expected)
    monkeypatch.setattr(torchax_fixes, "on_device", lambda tree: tree)
    module = compiled()
    with env, pytest.raises(AssertionError):  # the gap: torchax asserts on it
        module(torch.ones(4, device="jax"), torch.arange(4.0))


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))

    def forward(self, x, scale):
        return x * self.weight * scale


def test_a_host_scalar_keeps_the_dtype_pytorch_gives(env):
    """A 0-d host tensor does not promote a bfloat16 tensor in PyTorch; moved onto the
    device it is a weak scalar, so the compiled program stays bfloat16 too."""
    x, scale = torch.full((4,), 3.0, dtype=torch.bfloat16), torch.tensor(0.5)
    expected = Scaled()(x, scale)
    with env:
        module = jit.apply(Scaled().to("jax"), CompileRule(methods=["forward"]))
        got = module(x.to("jax"), scale)
        assert got.dtype == expected.dtype == torch.bfloat16
        assert torch.equal(got.cpu(), expected.detach())


def test_every_run_applies_the_fixes():
    fixes = ("core.deepcopy", "core.view_index", "core.type_as", "core.view_tolist",
             "core.view_of_view", "core.host_inplace")
    assert {"core.setitem", *fixes} <= set(patches.CORE_PATCHES)
    for name in fixes:
        patch = registry_mod.loaded().patches[name]
        library, version, fits = patch.installed_fits()
        assert fits, (name, library, version)


def test_an_inplace_op_on_a_host_tensor_with_device_operands(env):
    """MiniMax-H3's timestep plan: a table made with no device, rows set by indices
    from the device."""
    with env:
        table = torch.full((5,), 1.0)
        indices = torch.tensor([0, 2], device="jax")
        with pytest.raises(AttributeError, match="_env"):
            table[indices] = 3.0  # the gap
    with applied(core("core.host_inplace")), env:
        table = torch.full((5,), 1.0)
        table[indices] = 3.0
        table.add_(torch.ones(5, device="jax"))
        on_device = torch.zeros(3, device="jax")
        on_device[torch.tensor([1], device="jax")] = 2.0  # torchax's own: unchanged
        assert on_device.cpu().tolist() == [0.0, 2.0, 0.0]
    assert type(table) is torch.Tensor and table.tolist() == [4.0, 2.0, 4.0, 2.0, 2.0]
