"""Indexed assignment (``x[key] = value``) under torchax as PyTorch does it.

Two differences from torchax's own ``__setitem__``, both patched by
``core.setitem`` on every run:

PyTorch drops a value's leading size-1 dimensions before broadcasting it into
the target (``batch[i] = latent`` with ``latent`` of shape (1, C, T, H, W) and
``batch[i]`` of shape (C, T, H, W): Allegro's VAE does this); JAX's
``.at[key].set`` refuses it. ``value`` is reshaped the same way first.

Assignment into strided slices (``out[..., 0::2] = a``) without a scatter:
torchax lowers ``tensor[key] = value`` to ``x.at[key].set(value)``, and JAX
turns a slice with a step into a scatter: XLA runs it as a loop of its own on
CPU, between fusions, and cannot fuse what computes the value into it. Wan's
rotary embedding writes q and k that way, twice per attention (0.3 s of a 15 s
step of the 8k-token Wan block). The same assignment as
``where(mask, pad(value), x)`` is elementwise, so XLA fuses it with the
arithmetic that produces the value. The result is identical.
"""

from __future__ import annotations


def _static(bound) -> bool:
    return bound is None or (isinstance(bound, int) and not isinstance(bound, bool))


def full_slices(key, ndim: int) -> tuple[slice, ...] | None:
    """``key`` as one slice per dimension, or None if it holds anything but slices
    with Python-int bounds and at most one Ellipsis (integers, arrays, None)."""
    key = key if isinstance(key, tuple) else (key,)
    if sum(k is Ellipsis for k in key) > 1:
        return None
    if not all(k is Ellipsis or (isinstance(k, slice) and _static(k.start) and
                                 _static(k.stop) and _static(k.step)) for k in key):
        return None
    fill = ndim - (len(key) - (Ellipsis in key))
    if fill < 0:
        return None
    full = []
    for k in key:
        full.extend([slice(None)] * fill if k is Ellipsis else [k])
    return tuple(full + [slice(None)] * (ndim - len(full)))


def strided_set(x, key, value):
    """``x.at[key].set(value)`` for a key of slices with a positive step above 1
    somewhere, as pad + select; None for any other key (the caller scatters)."""
    import jax.numpy as jnp
    from jax import lax

    slices = full_slices(key, x.ndim)
    if slices is None:
        return None
    ranges = [range(*s.indices(n)) for s, n in zip(slices, x.shape)]
    if any(r.step < 1 for r in ranges) or all(r.step == 1 for r in ranges):
        return None
    shape = tuple(len(r) for r in ranges)
    if 0 in shape:
        return x  # nothing is assigned
    # per dimension: elements before the first target, after the last, and between
    layout = [(r.start, n - r[-1] - 1, r.step - 1) for r, n in zip(ranges, x.shape)]
    value = jnp.broadcast_to(jnp.asarray(value).astype(x.dtype), shape)
    placed = lax.pad(value, jnp.zeros((), x.dtype), layout)
    targets = lax.pad(jnp.ones(shape, bool), jnp.zeros((), bool), layout)
    return jnp.where(targets, placed, x)


def without_leading_ones(value):
    """``value`` without its leading size-1 dimensions (PyTorch's rule for the value
    of an indexed assignment); scalars and anything without a shape as they are."""
    shape = getattr(value, "shape", ())
    ones = next((i for i, n in enumerate(shape) if n != 1), len(shape))
    return value.reshape(shape[ones:]) if ones else value


def setitem(original):
    """Patch factory for torchax's ``Tensor.__setitem__``."""
    def __setitem__(self, key, value):
        key, value = self._env.t2j_iso((key, value))
        value = without_leading_ones(value)
        result = strided_set(self._elem, key, value)
        if result is None:
            return original(self, key, value)  # JAX arrays pass through its conversion
        self._elem = result
    __setitem__.__doc__ = original.__doc__
    return __setitem__
