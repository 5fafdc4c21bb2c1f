"""CogVideoX-specific patches, usable outside Porter in a ``with`` block."""

from __future__ import annotations

import torch

from porter.patches import Patch


def _host_timestep(original):
    def step(self, model_output, timestep, *args, **kwargs):
        # The schedulers index host tables with the timestep (alphas_cumprod[t]);
        # a device tensor cannot index a host tensor, a Python int can.
        if isinstance(timestep, torch.Tensor):
            timestep = int(timestep.jax() if hasattr(timestep, "jax") else timestep.item())
        return original(self, model_output, timestep, *args, **kwargs)
    step.__doc__ = original.__doc__
    return step


def _host_rotary(original):
    cache: dict = {}

    def prepare(self, height, width, num_frames, device):
        # Built once per shape on the host (PyTorch, CPU), then moved: the tables
        # reach the compiled transformer as inputs, never computed on the device.
        key = (height, width, num_frames, type(self.transformer).__name__,
               self.transformer.config.attention_head_dim)
        if key not in cache:
            cache[key] = original(self, height, width, num_frames, torch.device("cpu"))
        return tuple(t.to(device) for t in cache[key])
    prepare.__doc__ = original.__doc__
    return prepare


SCHEDULER_DDIM = Patch(
    name="cogvideox.ddim_host_timestep",
    target="diffusers:CogVideoXDDIMScheduler.step",
    doc="Pass the timestep to CogVideoXDDIMScheduler.step as a Python int: the step "
        "indexes host tables with it, which a JAX tensor cannot do.",
    replacement=_host_timestep, fits="diffusers>=0.30")

SCHEDULER_DPM = Patch(
    name="cogvideox.dpm_host_timestep",
    target="diffusers:CogVideoXDPMScheduler.step",
    doc="The same for CogVideoXDPMScheduler.step (CogVideoX-5b and 1.5 use it).",
    replacement=_host_timestep, fits="diffusers>=0.30")

ROTARY = Patch(
    name="cogvideox.rope_cache",
    target="diffusers:CogVideoXPipeline._prepare_rotary_positional_embeddings",
    doc="Build CogVideoX's 3D rotary tables on the host (PyTorch, CPU) once per "
        "resolution and frame count, then hand them to the device: they arrive at the "
        "compiled transformer as inputs.",
    replacement=_host_rotary, fits="diffusers>=0.30")

ROTARY_I2V = Patch(
    name="cogvideox.rope_cache_i2v",
    target="diffusers:CogVideoXImageToVideoPipeline._prepare_rotary_positional_embeddings",
    doc="The same for CogVideoXImageToVideoPipeline.",
    replacement=_host_rotary, fits="diffusers>=0.30")

ALL = (SCHEDULER_DDIM, SCHEDULER_DPM, ROTARY, ROTARY_I2V)
