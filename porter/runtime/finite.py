"""NaN and infinity, caught where they enter (weights, saved stages) and where they
matter (the latents after each denoising step), instead of ending as a black video."""

from __future__ import annotations

import functools

import torch


def count(tensor: torch.Tensor) -> int:
    """How many values of a host tensor are NaN or infinite (0 for integer tensors).

    One pass that allocates nothing for the common, all-finite case: min and max
    are finite exactly when every value is (NaN propagates through both), at the
    speed of reading memory (~17 GB/s here, against 0.4 GB/s for ``isfinite``)."""
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return 0
    low, high = torch.aminmax(tensor)
    if bool(torch.isfinite(low)) and bool(torch.isfinite(high)):
        return 0
    return int((~torch.isfinite(tensor)).sum())


@functools.cache
def _all_finite():
    import jax
    import jax.numpy as jnp

    return jax.jit(lambda x: jnp.isfinite(x).all())


def on_device(tensor) -> bool:
    """Are all values of a torchax tensor finite? One scalar reduction on the
    devices and a one-value read; every process of a run gets the same answer."""
    import numpy as np

    array = tensor.jax() if hasattr(tensor, "jax") else tensor
    if not np.issubdtype(array.dtype, np.inexact):
        return True
    return bool(np.asarray(_all_finite()(array)))
