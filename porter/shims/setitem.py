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
arithmetic that produces the value. The result is identical. The pads are at the
edges only (see ``strided_set``): the TPU compiler unrolls interior padding.
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
    somewhere, as a select between ``x`` and ``value`` put in place by edge pads and
    broadcasting; None for any other key (the caller scatters).

    A dimension of step ``s`` is split into (groups, s): its targets are one slot of
    each group in a run of groups, so ``value`` needs at most edge padding over the
    groups and broadcasting over the slots. Interior padding (``lax.pad``'s third
    figure) would say it in one op, but the TPU compiler emits a padded lane
    dimension element by element: Wan's rotary writes q and k that way in every
    block, and each such pad was ~150 MB of the compiler's instruction listing (its
    LLO dump), most of a 1.3B transformer's 150 s compile (22 s without)."""
    import jax.numpy as jnp
    from jax import lax

    slices = full_slices(key, x.ndim)
    if slices is None:
        return None
    ranges = [range(*s.indices(n)) for s, n in zip(slices, x.shape)]
    if any(r.step < 1 for r in ranges) or all(r.step == 1 for r in ranges):
        return None
    if any(len(r) == 0 for r in ranges):
        return x  # nothing is assigned
    value = jnp.broadcast_to(jnp.asarray(value).astype(x.dtype),
                             tuple(len(r) for r in ranges))
    split, value_split, pads, slots, full = [], [], [], {}, []
    for r, n in zip(ranges, x.shape):
        groups = -(-n // r.step)  # x's dimension, padded at its end to whole groups
        first = r.start // r.step
        split.append(groups)
        value_split.append(len(r))
        pads.append((first, groups - first - len(r), 0))
        if r.step > 1:
            slots[len(split)] = r.start % r.step  # the axis after the groups'
            split.append(r.step)
            value_split.append(1)  # broadcast over the slots
            pads.append((0, 0, 0))
        full.append(groups * r.step)
    grown = x if tuple(full) == x.shape else lax.pad(
        x, jnp.zeros((), x.dtype), [(0, f - n, 0) for f, n in zip(full, x.shape)])
    placed = value.reshape(value_split)
    if any(pad != (0, 0, 0) for pad in pads):
        placed = lax.pad(placed, jnp.zeros((), x.dtype), pads)
    targets = True
    for axis, (low, high, _) in enumerate(pads):
        index = lax.broadcasted_iota(jnp.int32, split, axis)
        if axis in slots:
            targets = targets & (index == slots[axis])
        elif low or high:
            targets = targets & (index >= low) & (index < split[axis] - high)
    out = jnp.where(targets, placed, grown.reshape(split)).reshape(full)
    return out[tuple(slice(0, n) for n in x.shape)]


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
