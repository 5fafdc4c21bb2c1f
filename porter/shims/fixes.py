"""Where torchax does not yet behave as PyTorch does, fixed for every run (besides
``porter.shims.setitem``): each is a core patch (``porter/registry/builtin.py``) with the versions it
is known to fit, and ``tests/shims/test_fixes.py`` shows the gap it closes.

- ``copy.deepcopy`` of a tensor inside torchax's environment: PyTorch copies a host
  tensor by making an empty one and pointing it at a copy of the storage
  (``aten::set_.source_Storage``), which torchax has no lowering for; a pipeline that
  deep-copies its scheduler stops there. A host tensor is now copied by PyTorch with
  torchax's modes set aside; a torchax tensor (its JAX array is immutable) by a new
  tensor around the same array.
- ``x.type_as(other)``: torchax casts ``x`` in place (every other holder of ``x`` sees
  the new dtype) and reads ``other``'s array, which a view (``y[:, :1]``) does not
  have; Helios's transformer stops there. Now a new tensor of ``other.dtype``, as in
  PyTorch (``x`` itself when the dtype is already that).
- List or tensor indexing of a view (``t[:5][[0, -1]]``): torchax indexes the
  view's parent array, which a view does not have. Such indexing copies in PyTorch
  too, so the view is made a tensor first; plain slicing keeps the view. The same
  for a view's values as a Python list (``grid_sizes[0].tolist()``: Wan Animate 2),
  which PyTorch refuses for a tensor subclass without its own ``tolist``.
- A view of a view (``packed[:, 0:n].view(b, f, hw, h, d)[:, :, :k] = q``: Wan Animate
  2's attention packs its tokens so): torchax's views are slices only, so ``.view``
  of one copied it and the assignment never reached ``packed``. ``.view(shape)`` of
  a view is now a view whose writes are reshaped back into its parent.
- An in-place op on a host tensor with device operands (``row[indices] = 0.5``, a
  table made with no device, indices from the device: MiniMax-H3's timestep plan):
  torchax mutates its own tensors only and stops on the host one. The op now runs on
  a device copy, whose values are copied back into the host tensor, which stays one.

Tensors a pipeline makes on the host (``torch.arange(n)`` with no device) and passes
to a compiled component are moved to the device where they cross into the program
(``porter.transforms.jit.autosplit``), not here.
"""

from __future__ import annotations

import operator

from porter.shims import lazy
from porter.shims.compat import import_torchax
from porter.shims.interop import to_host

torch = lazy.module("torch", __name__)


def deepcopy(original, **_):
    """``torch.Tensor.__deepcopy__`` that works inside torchax's environment."""

    def __deepcopy__(self, memo):
        from torchax.tensor import Tensor

        if isinstance(self, Tensor):
            if id(self) not in memo:
                memo[id(self)] = Tensor(self._elem, self._env)
            return memo[id(self)]
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes(), torch._C.DisableTorchFunction():
            return original(self, memo)

    __deepcopy__.__doc__ = f"patched by porter: copies under torchax (was {original!r})"
    return __deepcopy__


def type_as(original, **_):
    """``torchax.tensor.Tensor.type_as`` that returns a new tensor and takes a view."""

    def type_as(self, other):
        return self if self.dtype == other.dtype else self.to(other.dtype)

    type_as.__doc__ = f"patched by porter: PyTorch's type_as (was {original!r})"
    return type_as


def advanced(indexes) -> bool:
    """Does an index hold a list or a tensor (indexing that copies, not a view)?"""
    parts = indexes if isinstance(indexes, tuple) else (indexes,)
    return any(isinstance(part, (list, torch.Tensor)) for part in parts)


def view_getitem(original, **_):
    """``torchax.view.View.__getitem__`` that takes list and tensor indices."""

    def __getitem__(self, indexes):
        if advanced(indexes):
            return self.torch()[indexes]
        return original(self, indexes)

    __getitem__.__doc__ = f"patched by porter: advanced indexing of views (was {original!r})"
    return __getitem__


def view_tolist(original, **_):
    """``torchax.view.View.tolist``: the values of the tensor the view stands for."""

    def tolist(self):
        return self.torch().tolist()

    tolist.__doc__ = f"patched by porter: a view's values as a list (was {original!r})"
    return tolist


def reshape_info(shape: tuple):
    """A torchax view step that reshapes (``Tensor.view(shape)``): read as a reshape of
    its parent, written back as the inverse reshape."""
    import math

    from torchax.view import ViewInfo, ViewInfoType

    class ReshapeInfo(ViewInfo):
        def __init__(self):
            super().__init__(ViewInfoType.RESHAPE)
            self.shape = shape

        def calculate_output_shape(self, source) -> list[int]:
            known = math.prod(size for size in shape if size != -1)
            made = [source.size // max(known, 1) if size == -1 else size for size in shape]
            if math.prod(made) != source.size or sum(size == -1 for size in shape) > 1:
                raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size "
                                   f"{source.size}")  # PyTorch's words, at the call
            return made

        def transform_tensor(self, jax_array):
            return jax_array.reshape(shape)

        def update_tensor(self, new_value, jax_array):
            return new_value.reshape(jax_array.shape).astype(jax_array.dtype)

    return ReshapeInfo()


def view_of_view(original, **_):
    """``torchax.view.View.view``: a view of the view when given a shape (a dtype's view
    stays torchax's own)."""

    def view(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
            shape = tuple(shape[0])
        try:  # sizes as ints (numpy's too); a dtype is not one
            sizes = tuple(operator.index(size) for size in shape)
        except TypeError:
            return original(self, *shape)
        if not sizes:
            return original(self, *shape)
        return self.create_sub_view(reshape_info(sizes))

    view.__doc__ = f"patched by porter: views of views write through (was {original!r})"
    return view


def host_inplace(original, **_):
    """``torchax.ops.op_base.InplaceOp.__call__`` that mutates a host tensor too."""

    def __call__(self, *args, **kwargs):
        target = args[self.position_to_mutate]
        if type(target) is not torch.Tensor or target.device.type != "cpu":
            return original(self, *args, **kwargs)
        moved = on_device(target) if target.dim() else on_device(target[None])[0]
        position = self.position_to_mutate
        original(self, *args[:position], moved, *args[position + 1:], **kwargs)
        with torch.utils._python_dispatch._disable_current_modes(), \
                torch._C.DisableTorchFunction():
            target.copy_(to_host(moved))
        return target

    __call__.__doc__ = f"patched by porter: in-place ops on host tensors (was {original!r})"
    return __call__


def on_device(tree):
    """``tree`` with every host tensor (a plain ``torch.Tensor``, not torchax's) made a
    torchax tensor: what a compiled program can take. A 0-d one becomes a weakly typed
    scalar: in PyTorch a 0-d tensor does not promote the dtype of a tensor with
    dimensions (a bfloat16 ``x * torch.tensor(0.5)`` stays bfloat16), and a weak JAX
    scalar does not either."""

    torchax = import_torchax()

    def moved(value):
        if type(value) is not torch.Tensor or value.device.type != "cpu":
            return value
        env = torchax.default_env()
        if value.dim() == 0:
            import jax.numpy as jnp
            return torchax.tensor.Tensor(jnp.asarray(value.item()), env)
        return env.to_xla(value)

    return torch.utils._pytree.tree_map(moved, tree)
