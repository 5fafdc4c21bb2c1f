"""Move a torch module's weights onto the JAX mesh as torchax tensors."""

from __future__ import annotations

import torch


def apply(module: torch.nn.Module, runtime) -> torch.nn.Module:
    """Convert parameters and buffers to torchax tensors placed on the mesh.

    Every tensor is replicated over the mesh for now. float64 buffers become
    float32 because JAX runs with x64 disabled.
    """
    import jax

    sharding = runtime.replicated()
    with runtime.env:
        module.to("jax")
    for tensor in _tensors(module):
        tensor._elem = jax.device_put(tensor._elem, sharding)
    return module


def _tensors(module: torch.nn.Module):
    seen = set()
    for sub in module.modules():
        for store in (sub._parameters, sub._buffers):
            for tensor in store.values():
                if tensor is not None and id(tensor) not in seen:
                    seen.add(id(tensor))
                    yield tensor
