"""Moving tensors between host PyTorch and torchax (JAX) tensors."""

from __future__ import annotations

import numpy as np
import torch

from porter.transforms import placement


def to_host(tensor) -> torch.Tensor:
    """A CPU torch tensor with the values of a torchax (or CPU) tensor."""
    if hasattr(tensor, "jax"):
        array = _fetch(tensor.jax())
        if array.dtype.name == "bfloat16":  # numpy has no bfloat16 of its own
            return torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16)
        return torch.from_numpy(array.copy())
    return tensor.detach().cpu()


def _fetch(array) -> np.ndarray:
    """The whole array on this host. Parts held by other processes are gathered, a
    collective: every process of a multi-process run must call this together."""
    if not array.is_fully_addressable and not array.is_fully_replicated:
        from jax.experimental import multihost_utils
        array = multihost_utils.process_allgather(array, tiled=True)
    return np.asarray(array)


def to_device(tensor: torch.Tensor, runtime):
    """A torchax tensor on the mesh (replicated) holding a host tensor's values,
    placed from the host on every device (not first on one device, then copied)."""
    return placement.replicated(tensor, runtime)
