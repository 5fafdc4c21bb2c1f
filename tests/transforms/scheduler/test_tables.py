"""Every common diffusers scheduler steps JAX latents as it steps host ones
(``porter.transforms.scheduler.tables``), with no recipe entry and no patch of its own."""

import inspect

import numpy as np
import pytest
import torch

from porter import recipe, runtime
from porter.transforms.scheduler.tables import METHODS, on_device

from support import RECIPES

# the schedulers diffusers' video pipelines ship with, and the other common ones;
# the first six failed under torchax before (a host table indexed by a JAX timestep)
SCHEDULERS = ["DDIMScheduler", "DDPMScheduler", "PNDMScheduler", "LCMScheduler",
              "TCDScheduler", "CogVideoXDDIMScheduler", "EulerDiscreteScheduler",
              "EulerAncestralDiscreteScheduler", "DPMSolverMultistepScheduler",
              "DPMSolverSinglestepScheduler", "UniPCMultistepScheduler",
              "DEISMultistepScheduler", "HeunDiscreteScheduler", "KDPM2DiscreteScheduler",
              "LMSDiscreteScheduler", "SASolverScheduler", "EDMEulerScheduler",
              "FlowMatchEulerDiscreteScheduler", "CogVideoXDPMScheduler"]


@pytest.fixture(scope="module")
def rt():
    return runtime.start(recipe.load(RECIPES / "wan-tiny.yaml", ["mesh.dp=8"]))


def _denoise(scheduler, latents, place, steps=6):
    """A stand-in denoising loop as pipelines write it: the model output is a fixed
    function of the scaled input; stochastic steps draw from a seeded generator.
    CogVideoX's DPM step also takes the previous step's output."""
    scheduler.set_timesteps(steps, device="jax" if place else None)
    step_args = inspect.signature(type(scheduler).step).parameters
    generator = torch.Generator().manual_seed(1)
    previous = None
    for i, t in enumerate(scheduler.timesteps):
        scale = getattr(scheduler, "scale_model_input", None)
        model_input = scale(latents, t) if scale else latents
        output = model_input * 0.3 + 0.1
        kwargs = {"generator": generator} if "generator" in step_args else {}
        if "old_pred_original_sample" in step_args:
            back = scheduler.timesteps[i - 1] if i else None
            latents, previous = scheduler.step(output, previous, t, back, latents,
                                               return_dict=False, **kwargs)
        else:
            latents = scheduler.step(output, t, latents, return_dict=False, **kwargs)[0]
    return latents


@pytest.mark.parametrize("name", SCHEDULERS)
def test_scheduler_steps_jax_latents_as_it_steps_host_ones(name, rt):
    import diffusers

    from porter.shims.interop import to_device, to_host

    cls = getattr(diffusers, name)
    start = torch.randn(1, 4, 2, 8, 8, generator=torch.Generator().manual_seed(0))
    expected = _denoise(cls(), start, place=False)
    scheduler = cls()
    before = [inspect.getattr_static(cls, m, None) for m in METHODS]
    with on_device(scheduler, rt), rt.env:
        got = to_host(_denoise(scheduler, to_device(start, rt), place=True))
    # float32 on both sides; the multistep solvers' log/exp arithmetic differs in the
    # last bits between XLA and PyTorch
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=0, atol=1e-4)
    assert [inspect.getattr_static(cls, m, None) for m in METHODS] == before  # restored


def test_without_it_ddim_fails_under_torchax(rt):
    """What the mechanism is for (if torchax learns to mix host tables with JAX
    tensors, this fails and the mechanism can go)."""
    import diffusers

    from porter.shims.interop import to_device

    start = torch.zeros(1, 4, 2, 8, 8)
    with rt.env, pytest.raises((AttributeError, AssertionError)):
        _denoise(diffusers.DDIMScheduler(), to_device(start, rt), place=True)
