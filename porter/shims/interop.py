"""Moving tensors between host PyTorch and JAX: a host tensor placed on the mesh in a
sharding, a device tensor read back to the host, and the dtypes they have on each side."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from porter.shims import lazy
from porter.shims.compat import import_torchax

torch = lazy.module("torch", __name__)

if TYPE_CHECKING:
    from porter.runtime import Runtime

# JAX runs with x64 disabled: these arrive as their 32-bit kind (what torchax and
# jax.device_put would make of them).
NARROWED = {"float64": "float32", "int64": "int32", "complex128": "complex64"}


def jax_dtype(dtype: torch.dtype) -> torch.dtype:
    """The torch dtype a tensor of ``dtype`` has once on a JAX device."""
    narrower = NARROWED.get(str(dtype).removeprefix("torch."))
    return getattr(torch, narrower) if narrower else dtype


def array_dtype(dtype: torch.dtype):
    """The JAX dtype of the array a torch tensor of ``dtype`` becomes on a device."""
    import_torchax()
    from torchax.ops.mappings import t2j_dtype

    return t2j_dtype(jax_dtype(dtype))


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


def to_device(tensor: torch.Tensor, runtime: Runtime):
    """A torchax tensor on the mesh (replicated) holding a host tensor's values,
    placed from the host on every device (not first on one device, then copied)."""
    from torchax.tensor import Tensor

    host = as_placed(tensor.detach().cpu())
    return Tensor(place(host, tuple(host.shape), runtime.replicated()), runtime.env)


def as_placed(host: torch.Tensor) -> torch.Tensor:
    """``host`` in the dtype it will have on a JAX device."""
    target = jax_dtype(host.dtype)
    return host if host.dtype == target else host.to(target)


def numpy_view(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor; bfloat16 and float8 through ml_dtypes (JAX's)."""
    try:
        return tensor.numpy()
    except TypeError:  # a dtype numpy has only through ml_dtypes
        import ml_dtypes

        bits = {1: torch.uint8, 2: torch.int16}[tensor.element_size()]
        kind = getattr(ml_dtypes, str(tensor.dtype).removeprefix("torch."))
        return tensor.view(bits).numpy().view(kind)


def place(host: torch.Tensor, shape: tuple[int, ...], sharding, rows: slice | None = None):
    """A jax.Array of ``shape`` placed by ``sharding``, from ``host``: the tensor's
    rows ``rows`` (all of them by default) in their final dtype, on the CPU.

    On a single-process CPU run a device's share that is the whole host tensor is
    handed over without a copy (DLPack); every other share is copied into its
    device's buffer, so no slice keeps a larger host tensor alive.
    """
    import jax

    offset = 0 if rows is None or rows.start is None else rows.start
    host = host.detach()
    if not host.is_contiguous():
        host = host.contiguous()
    whole = tuple(host.shape) == tuple(shape)
    zero_copy = (whole and host.dtype != torch.bool
                 and jax.process_count() == 1 and _platform(sharding) == "cpu")
    array = numpy_view(host)

    def shard(index):
        if offset and index:
            first = index[0]
            index = (slice((first.start or 0) - offset,
                           (shape[0] if first.stop is None else first.stop) - offset),
                     *index[1:])
        part = array[index]
        if zero_copy and part.shape == tuple(shape):
            return jax.dlpack.from_dlpack(host)
        return part

    return jax.make_array_from_callback(tuple(shape), sharding, shard)


def _platform(sharding) -> str:
    return next(iter(sharding.device_set)).platform


def unwrapped(model):
    """The module behind Porter's wrappers: input sharding (``ShardedInputs.module``)
    and whole-program compilation (torchax's ``JittableModule._model``)."""
    model = getattr(model, "module", model)
    return getattr(model, "_model", model)
