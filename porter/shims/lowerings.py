"""Porter's own lowerings of PyTorch operations, in torchax's op table while a port's
calls run (the compile pass's call-time part, ``porter.transforms.jit``), each with the
torchax versions whose lowering it replaces.

Group norm. torchax flattens each group to one axis, ``(1, N x groups, C/groups x T x
H x W)``, before taking its statistics. A video VAE's activations are split over
height and width (``sharding.activations``); merging those axes with the channels
loses their split, so every chip holds whole-frame temporaries: CogVideoX1.5's VAE
decode at 720p, 81 frames, needed 69.75 GiB per v6e chip with its activations split 8
ways. Here only the channel axis is split, into ``(groups, C/groups)``, and the
statistics reduce over the remaining axes in place: a split height or width stays
split. The statistics are taken in float32 for 16-bit inputs, as PyTorch does.

``aten._is_all_true`` (``torch._check_tensor_all``: HunyuanVideo I2V's Llava text
encoder checks its image tokens with it), which torchax has no lowering for.

Indexing with host tensors. PyTorch indexes a device tensor with a CPU index tensor
(``table[torch.zeros(n, dtype=torch.long)]``, as SkyReels-V2's diffusion-forcing
pipelines do with a timestep table made on the device); torchax asserts on the host
tensor. Host index tensors are moved to the device first (``torchax_fixes.on_device``).
A slice with 0-d tensor bounds (``alphas[t0:t1]``, Text2Video-Zero) is sliced at their
values, as PyTorch does; torchax keeps the tensors in a view that fails when read.

Attention rows with every key masked out. PyTorch's attention gives such a row zeros
(a left-padded prompt's padding rows under a causal mask: LTX-2's Gemma text
encoder); torchax's lowering gives NaN, which then spreads through the whole video.
Its result is kept where a row has a key to attend to, zero elsewhere.

``aten.hann_window`` (Kandinsky 6's super-resolution blends its tiles with Hann
windows), which torchax has no lowering for.

``aten.searchsorted.Scalar`` (``torch.searchsorted(table, 0.5)``: the DPM-Solver
scheduler's ``lambda_min_clipped``, Wan Animate 2's), which torchax lowers only for a
tensor of values (and always from the left). The index is the count of entries before
the number (``<`` from the left, ``<=`` from the right), along the last axis.

Python numbers from device scalars inside a constructor. ``torch.Tensor([0.25 *
sigma.log() for sigma in sigmas])`` (the Euler scheduler's Karras timesteps, which
Stable Video Diffusion uses) reads each element with ``Tensor.__float__``; torchax has
no lowering for it there and falls back to PyTorch's, which reads the placeholder
meta tensor beneath torchax's and fails. Each is read from its JAX array, giving a
host tensor as PyTorch does for device scalars.

Nearest-neighbour upsampling (``F.interpolate(mode="nearest" | "nearest-exact")``,
every video VAE's decoder). torchax runs PyTorch's decomposition, a gather with an
index per output element; with the activations split over width (``sharding.
activations``) the gather's operand is gathered onto every chip first. Each output
axis reads a source index PyTorch's own formula gives (float32, as its CPU kernel
computes it): where that is each input element repeated, as it is for integer
factors, the axes are broadcast and reshaped (elementwise, split axes stay split);
anything else is taken along each axis.

In-place operations on views. torchax runs about thirty in-place operations
(``addcmul_``, ``masked_fill_``, ``zero_``, ``silu_``, ...) through PyTorch's
decompositions, which first make a view (``out[..., 0::2]``) a tensor of its own:
the write never reaches the tensor viewed (LTX-2's rotary embedding lost its sine
term). Each such operation is computed out of place and copied into its target
(``copy_`` writes through a view); so is ``cumsum_``, which torchax has no way to
run at all.
"""

from __future__ import annotations

import contextlib

import torch

from porter.shims import op_table
from porter.shims.compat import import_torchax
from porter.shims.fixes import on_device

#: the torchax versions whose group norm flattens the spatial axes
FITS = "torchax>=0.0.11,<0.0.14"


def group_norm(input, weight, bias, N, C, HxW, group, eps=1e-5):
    """``aten.native_group_norm``: (output, mean, rstd), mean and rstd (N, group)."""
    import jax
    import jax.numpy as jnp

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


def _bound(value):
    """A slice bound as PyTorch reads it: a 0-d tensor is its integer."""
    return int(value) if isinstance(value, torch.Tensor) and value.dim() == 0 else value


def _indexes(indexes):
    if isinstance(indexes, slice):
        return slice(_bound(indexes.start), _bound(indexes.stop), _bound(indexes.step))
    if isinstance(indexes, tuple):
        return tuple(_indexes(part) for part in indexes)
    return indexes


def host_indices(getitem):
    """torchax's ``Tensor.__getitem__`` taking host index tensors and tensor slice
    bounds (``alphas[t0:t1]``), as PyTorch does."""
    def __getitem__(self, indexes):
        return getitem(self, on_device(_indexes(indexes)))
    return __getitem__


def masked_rows_zero(attention):
    """torchax's ``scaled_dot_product_attention`` giving zeros, as PyTorch does, for a
    query whose keys are all masked out (torchax: NaN)."""
    def scaled_dot_product_attention(query, key, value, attn_mask=None, *args, **kwargs):
        out = attention(query, key, value, attn_mask, *args, **kwargs)
        if attn_mask is None:
            return out
        if attn_mask.dtype == torch.bool:
            attends = attn_mask.any(-1, keepdim=True)
        else:
            attends = (attn_mask > float("-inf")).any(-1, keepdim=True)
        return torch.where(attends, out, torch.zeros((), dtype=out.dtype, device=out.device))
    return scaled_dot_product_attention


def written_through(functional):
    """An in-place operation as its out-of-place ``functional`` and a ``copy_`` into
    the target, which reaches the tensor a view views."""

    view = import_torchax().view.View

    def inplace(target, *args, **kwargs):
        source = target.torch() if isinstance(target, view) else target
        target.copy_(functional(source, *args, **kwargs))
        return target
    return inplace


def is_all_true(x):
    """``aten._is_all_true`` (``torch._check_tensor_all``, which transformers' Llava
    text encoder calls on its image-token mask): torchax has no lowering."""
    return torch.all(x)


def hann_window(window_length, periodic=True, *, dtype=None, layout=None, device=None,
                pin_memory=None):
    """``torch.hann_window``: ``sin(pi n / N)**2``, N the length (periodic) or one less."""
    import math

    span = window_length if periodic else window_length - 1
    if window_length <= 1:
        return torch.ones(window_length, dtype=dtype or torch.get_default_dtype(),
                          device=device)
    n = torch.arange(window_length, dtype=dtype or torch.get_default_dtype(), device=device)
    return torch.sin(n * (math.pi / span)) ** 2


def searchsorted_scalar(sorted_sequence, value, *, out_int32=False, right=False, side=None,
                        sorter=None):
    """``torch.searchsorted`` of one number: how many entries precede it."""
    if sorter is not None:
        sorted_sequence = sorted_sequence.gather(-1, sorter)
    before = sorted_sequence <= value if (side or ("right" if right else "left")) == "right" \
        else sorted_sequence < value
    return before.sum(-1).to(torch.int32 if out_int32 else torch.int64)


def number(convert):
    """``Tensor.__float__`` / ``__int__`` of a torchax scalar: its JAX array's value."""
    def read(self):
        return convert(self.jax().item())
    return read


def _nearest_sources(size: int, out: int, scale, exact: bool):
    """The input index each of ``out`` outputs reads along one axis, as PyTorch's CPU
    kernels compute it (``nearest_idx``, ``nearest_neighbor_exact_compute_source_index``:
    float32 arithmetic, the scale ``1/scale`` when one above 0 is given, else
    ``size/out``)."""
    import numpy as np

    step = (np.float32(1.0 / scale) if scale is not None and scale > 0
            else np.float32(size) / np.float32(out))
    positions = np.arange(out, dtype=np.float32)
    if exact:  # nearest-exact has no shortcuts in PyTorch
        positions = positions + np.float32(0.5)
    elif out in (size, 2 * size):  # nearest's: the same size, or twice it
        return np.arange(out) * size // out
    return np.minimum(np.floor(positions * step).astype(np.int64), size - 1)


#: the per-axis scale arguments of ``upsample_nearest{1,2,3}d.default``, by axes
_SCALE_NAMES = {1: ("scales",), 2: ("scales_h", "scales_w"),
                3: ("scales_d", "scales_h", "scales_w")}


def upsample_nearest(exact: bool, vec: bool):
    """``aten.upsample_nearest{1,2,3}d`` (``exact``: ``_upsample_nearest_exact*``): the
    ``.vec`` overload (input, output_size, scale_factors) or, not ``vec``, the default
    one (input, output_size, one scale per axis)."""
    def lowering(input, output_size=None, *args, **kwargs):
        import jax.numpy as jnp
        import numpy as np

        interop = import_torchax().interop
        x = interop.jax_view(input)
        names = _SCALE_NAMES[x.ndim - 2]
        if vec:
            scales = list((args[0] if args else kwargs.get("scale_factors")) or [])
        else:
            scales = list(args) + [kwargs.get(name) for name in names[len(args):]]
        scales += [None] * (len(names) - len(scales))
        sizes = x.shape[2:]
        outs = list(output_size) if output_size else [
            int(np.floor(n * s)) for n, s in zip(sizes, scales)]
        for axis, (size, out, scale) in enumerate(zip(sizes, outs, scales), 2):
            sources = _nearest_sources(size, int(out), scale, exact)
            if out % size == 0 and np.array_equal(sources, np.arange(out) // (out // size)):
                wide = x.shape[:axis + 1] + (out // size,) + x.shape[axis + 1:]
                x = jnp.broadcast_to(jnp.expand_dims(x, axis + 1), wide).reshape(
                    x.shape[:axis] + (out,) + x.shape[axis + 1:])
            else:
                x = jnp.take(x, jnp.asarray(sources, jnp.int32), axis=axis)
        return interop.torch_view(x)
    return lowering


def _upsample_lowerings() -> dict:
    """The two value-returning overloads of each nearest upsampling op (``.out`` ones
    stay with torchax's decomposition)."""
    found = {}
    for name, exact in (("upsample_nearest{}d", False), ("_upsample_nearest_exact{}d", True)):
        for axes in (1, 2, 3):
            packet = getattr(torch.ops.aten, name.format(axes))
            found[packet.default] = upsample_nearest(exact, vec=False)
            found[packet.vec] = upsample_nearest(exact, vec=True)
    return found


#: op -> Porter's lowering
LOWERINGS = {torch.ops.aten.native_group_norm: group_norm,
             torch.ops.aten._is_all_true: is_all_true,
             torch.ops.aten.hann_window: hann_window,
             torch.ops.aten.searchsorted.Scalar: searchsorted_scalar,
             **_upsample_lowerings(),
             torch._C.TensorBase.__float__: number(float),
             torch._C.TensorBase.__int__: number(int)}
#: op -> a wrapper of torchax's lowering (which keeps its other properties)
WRAPPERS = {torch.Tensor.__getitem__: host_indices,
            torch.nn.functional.scaled_dot_product_attention: masked_rows_zero,
            torch.ops.aten.scaled_dot_product_attention: masked_rows_zero}
#: id(env) -> (env, its in-place operations torchax decomposes: packet -> out-of-place)
_DECOMPOSED_INPLACE: dict = {}
#: in-place operations torchax neither lowers nor decomposes, whose out-of-place one it
#: lowers with the same arguments (Kandinsky 6 SR's NABLA mask: ``vals.cumsum_(-1)``)
UNLOWERED_INPLACE = (torch.ops.aten.cumsum_,)


def decomposed_inplace(env) -> dict:
    """The in-place ATen operations ``env`` runs through a decomposition (none of its
    own lowerings), each with its out-of-place operation."""
    key = id(env)
    if _DECOMPOSED_INPLACE.get(key, (None,))[0] is not env:
        found = {}
        for name in dir(torch.ops.aten):
            if not name.endswith("_") or name.startswith("_") \
                    or not hasattr(torch.ops.aten, name[:-1]):
                continue
            packet = getattr(torch.ops.aten, name)
            if any(env._ops.get(getattr(packet, overload)) is not None
                   for overload in packet.overloads()) or packet in env._ops:
                continue  # torchax's own lowering (a view op: writes through)
            if any(env._decomps.get(getattr(packet, overload)) is not None
                   for overload in packet.overloads()) or packet in UNLOWERED_INPLACE:
                found[packet] = getattr(torch.ops.aten, name[:-1])
        _DECOMPOSED_INPLACE[key] = (env, found)  # the env kept: its id stays its own
    return _DECOMPOSED_INPLACE[key][1]


@contextlib.contextmanager
def installed(env):
    """Porter's lowerings in ``env``'s op table for the block, then torchax's again."""
    inplace = decomposed_inplace(env)
    own = {**LOWERINGS, **{op: written_through(functional)
                           for op, functional in inplace.items()}}
    with op_table.overridden(env, own, view_ops=frozenset(inplace), wrapped=WRAPPERS):
        yield
