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
  too, so the view is made a tensor first; plain slicing keeps the view.

Tensors a pipeline makes on the host (``torch.arange(n)`` with no device) and passes
to a compiled component are moved to the device where they cross into the program
(``porter.transforms.jit.autosplit``), not here.
"""

from __future__ import annotations

import torch

from porter.shims.compat import import_torchax


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
