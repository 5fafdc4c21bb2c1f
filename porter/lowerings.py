"""Porter's own lowerings of PyTorch operations, in torchax's op table while a port's
programs are traced (``porter.porting.ops_installed``), each with the torchax versions
whose lowering it replaces.

Group norm. torchax flattens each group to one axis, ``(1, N x groups, C/groups x T x
H x W)``, before taking its statistics. A video VAE's activations are split over
height and width (``sharding.activations``); merging those axes with the channels
loses their split, so every chip holds whole-frame temporaries: CogVideoX1.5's VAE
decode at 720p, 81 frames, needed 69.75 GiB per v6e chip with its activations split 8
ways. Here only the channel axis is split, into ``(groups, C/groups)``, and the
statistics reduce over the remaining axes in place: a split height or width stays
split. The statistics are taken in float32 for 16-bit inputs, as PyTorch does.
"""

from __future__ import annotations

import contextlib

import torch

#: the torchax versions whose group norm flattens the spatial axes
FITS = "torchax>=0.0.11,<0.0.14"


def group_norm(input, weight, bias, N, C, HxW, group, eps=1e-5):
    """``aten.native_group_norm``: (output, mean, rstd), mean and rstd (N, group)."""
    import jax
    import jax.numpy as jnp

    from porter.compat import import_torchax

    interop = import_torchax().interop
    x, scale, shift = interop.jax_view((input, weight, bias))
    wide = jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else x.dtype
    grouped = x.reshape(N, group, C // group, *x.shape[2:]).astype(wide)
    axes = tuple(range(2, grouped.ndim))
    mean = grouped.mean(axis=axes, keepdims=True)
    rstd = jax.lax.rsqrt(jnp.square(grouped - mean).mean(axis=axes, keepdims=True) + eps)
    out = ((grouped - mean) * rstd).reshape(x.shape)
    per_channel = (1, C) + (1,) * (x.ndim - 2)
    if scale is not None:
        out = out * scale.astype(wide).reshape(per_channel)
    if shift is not None:
        out = out + shift.astype(wide).reshape(per_channel)
    return interop.torch_view((out.astype(x.dtype), mean.reshape(N, group).astype(x.dtype),
                               rstd.reshape(N, group).astype(x.dtype)))


#: op -> Porter's lowering
LOWERINGS = {torch.ops.aten.native_group_norm: group_norm}


@contextlib.contextmanager
def installed(env):
    """Porter's lowerings in ``env``'s op table for the block, then torchax's again."""
    saved = {op: env._ops.get(op) for op in LOWERINGS}
    for op, lowering in LOWERINGS.items():
        env.override_op_definition(op, lowering)
    try:
        yield
    finally:
        for op, previous in saved.items():
            if previous is None:
                env._ops.pop(op, None)
            else:
                env._ops[op] = previous
