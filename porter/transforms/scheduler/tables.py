"""The scheduler pass's call-time part: any diffusers scheduler, with no recipe entry,
keeps its tables where the latents are.

Schedulers keep tables as host tensors (``alphas_cumprod`` built in ``__init__``;
``sigmas``, which several move back to the CPU in ``set_timesteps``) and index
them with the timestep the pipeline passes in. Under Porter the timestep and the
latents are JAX tensors, and torchax cannot index or combine a host tensor with
them (DDIM, DDPM, PNDM, LCM, TCD fail; Euler and the multistep solvers happen to
work). So for the run, every scheduler method that meets the caller's tensors first
moves the scheduler's host tensors onto the mesh, replicated. A table moves once
after each ``set_timesteps``, not once per step: it stays a JAX tensor after that.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import types
from typing import TYPE_CHECKING

from porter.shims.interop import to_device
from porter.shims.attributes import replaced

if TYPE_CHECKING:
    from porter.runtime import Runtime

#: the methods that combine the scheduler's tables with the caller's tensors
METHODS = ("step", "scale_model_input", "add_noise", "scale_noise", "get_velocity")


def tables_on_device(scheduler, runtime: Runtime) -> None:
    """Move the scheduler's host tensors (and host tensors in its lists, such as the
    model outputs a multistep solver keeps) onto the mesh, replicated."""
    import torch

    def moved(value):
        if isinstance(value, torch.Tensor) and not hasattr(value, "jax"):
            return to_device(value, runtime)
        return value

    for name, value in list(vars(scheduler).items()):
        if isinstance(value, torch.Tensor):
            setattr(scheduler, name, moved(value))
        elif isinstance(value, list) and any(isinstance(v, torch.Tensor) for v in value):
            setattr(scheduler, name, [moved(v) for v in value])


@contextlib.contextmanager
def on_device(scheduler, runtime: Runtime):
    """For the block, the scheduler's class moves its tables onto the mesh at the start
    of each of its ``METHODS``; the class is as before afterwards (nothing happens for
    a pipeline without a scheduler)."""
    if scheduler is None:
        yield
        return
    cls = type(scheduler)

    def moving(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            tables_on_device(self, runtime)
            return method(self, *args, **kwargs)
        return call

    with contextlib.ExitStack() as stack:
        for name in METHODS:
            method = inspect.getattr_static(cls, name, None)
            if isinstance(method, types.FunctionType):  # not static or class methods
                stack.enter_context(replaced(cls, name, moving(method)))
        yield
