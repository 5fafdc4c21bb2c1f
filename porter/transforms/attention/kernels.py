"""Attention kernels on JAX arrays laid out (batch, heads, sequence, head_dim).

Every kernel takes ``keep``: None, or a boolean mask broadcastable to
(batch, heads, q_len, k_len) where False means "this key gets zero weight".
Masking is exact: a masked key's score is -inf before the softmax, so it takes
no probability mass (zeroing its key and value would still give it mass).
A query row with no key kept returns zeros.
"""

from __future__ import annotations

import math
from functools import partial

from porter.shims import lazy

jax = lazy.module("jax", __name__)
jnp = lazy.module("jax.numpy", __name__)

NEG_INF = -math.inf


def scaled_scores(q, k, scale):
    """q k^T * scale in float32, for (batch, heads, sequence, head_dim) arrays."""
    return jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32) * scale


def reference(q, k, v, keep=None, *, scale: float, **_):
    """softmax(q k^T * scale) v, materialising every score (memory ~ q_len x k_len)."""
    scores = scaled_scores(q, k, scale)
    if keep is not None:
        scores = jnp.where(keep, scores, NEG_INF)
    peak = jnp.max(scores, axis=-1, keepdims=True)
    peak = jnp.where(jnp.isfinite(peak), peak, 0.0)
    weights = jnp.exp(scores - peak)
    total = jnp.sum(weights, axis=-1, keepdims=True)
    weights = weights / jnp.where(total > 0, total, 1.0)
    return jnp.einsum("bhqk,bhkd->bhqd", weights.astype(v.dtype), v,
                      preferred_element_type=jnp.float32).astype(q.dtype)


def pad(x, axis: int, multiple: int, value=0):
    size = x.shape[axis]
    extra = -size % multiple
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def as_4d(keep):
    """A keep mask with leading broadcast dimensions made explicit: (B|1, H|1, Q|1, K)."""
    keep = jnp.asarray(keep, dtype=bool)
    return keep.reshape((1,) * (4 - keep.ndim) + keep.shape)


def _block_keep(keep, batch, heads, q_len, k_len):
    """``keep`` as a 4-d mask of shape (B|1, H|1, Q|1, K)."""
    if keep is None:
        return jnp.ones((1, 1, 1, k_len), dtype=bool)
    keep = as_4d(keep)
    shape = tuple(keep.shape[i] if keep.shape[i] == 1 else n
                  for i, n in enumerate((batch, heads, q_len, k_len)))
    return jnp.broadcast_to(keep, shape)


def blockwise(q, k, v, keep=None, *, scale: float, block_q: int = 512, block_kv: int = 512,
              **_):
    """Online-softmax attention over key/value blocks, one query block at a time.

    Working memory is batch x heads x block_q x block_kv scores, whatever the
    sequence length. Sequences are padded to block multiples (padded keys are
    masked, padded queries dropped).
    """
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    block_q, block_kv = min(block_q, q_len), min(block_kv, k_len)
    keep = _block_keep(keep, batch, heads, q_len, k_len)
    qp = pad(q, 2, block_q)
    kp, vp = pad(k, 2, block_kv), pad(v, 2, block_kv)
    keep = pad(keep, 3, block_kv, value=False)
    if keep.shape[2] != 1:
        keep = pad(keep, 2, block_q, value=True)
    nq, nk = qp.shape[2] // block_q, kp.shape[2] // block_kv

    q_blocks = blocks(qp, block_q)
    k_blocks, v_blocks = blocks(kp, block_kv), blocks(vp, block_kv)
    kb, kh, kq = keep.shape[:3]
    keep_k = jnp.moveaxis(keep.reshape(kb, kh, kq, nk, block_kv), 3, 0)

    def one_query_block(args):
        q_block, q_index = args
        if kq == 1:
            keep_q = keep_k
        else:
            keep_q = jax.lax.dynamic_slice_in_dim(keep_k, q_index * block_q, block_q, axis=3)

        def step(carry, inputs):
            k_block, v_block, keep_block = inputs
            return online_step(carry, q_block, k_block, v_block, keep_block, scale), None

        (_, total, acc), _ = jax.lax.scan(step, online_start(q_block),
                                          (k_blocks, v_blocks, keep_q))
        return online_result(total, acc)

    out = jax.lax.map(one_query_block, (q_blocks, jnp.arange(nq)))
    return unblocked(out, q_len).astype(q.dtype)


def blocks(x, size: int):
    """(batch, heads, n * size, ...) as (n, batch, heads, size, ...): blocks on a leading
    axis, for lax.map and lax.scan to walk."""
    return jnp.moveaxis(x.reshape(*x.shape[:2], x.shape[2] // size, size, *x.shape[3:]),
                        2, 0)


def unblocked(x, length: int):
    """``blocks``' inverse, cut to ``length`` (the padding dropped)."""
    x = jnp.moveaxis(x, 0, 2)
    return x.reshape(*x.shape[:2], -1, *x.shape[4:])[:, :, :length]


def online_start(q_block, width: int | None = None):
    """An online softmax's running (peak, total, weighted sum) before any key block;
    ``width``: the values' (the queries' where not given)."""
    batch, heads, size, dim = q_block.shape
    return (jnp.full((batch, heads, size), NEG_INF, jnp.float32),
            jnp.zeros((batch, heads, size), jnp.float32),
            jnp.zeros((batch, heads, size, width or dim), jnp.float32))


def online_step(carry, q_block, k_block, v_block, keep_block, scale: float):
    """One key block into an online softmax's running (peak, total, weighted sum): the
    earlier blocks' sums rescaled to the new peak (a row with nothing kept yet keeps
    its -inf peak and zero sums)."""
    scores = jnp.where(keep_block, scaled_scores(q_block, k_block, scale), NEG_INF)
    return online_update(carry, scores, v_block)


def online_update(carry, scores, v_block):
    """``online_step`` from a key block's scores, masked ones already -inf."""
    peak, total, acc = carry
    new_peak = jnp.maximum(peak, jnp.max(scores, axis=-1))
    safe = jnp.where(jnp.isfinite(new_peak), new_peak, 0.0)
    weights = jnp.exp(scores - safe[..., None])
    correction = jnp.exp(jnp.where(jnp.isfinite(peak), peak - safe, NEG_INF))
    total = total * correction + jnp.sum(weights, axis=-1)
    acc = acc * correction[..., None] + jnp.einsum(
        "bhqk,bhkd->bhqd", weights.astype(v_block.dtype), v_block,
        preferred_element_type=jnp.float32)
    return new_peak, total, acc


def online_result(total, acc):
    """The attention output of an online softmax's sums (zeros where no key was kept)."""
    return acc / jnp.where(total > 0, total, 1.0)[..., None]


def key_padding(keep, batch: int, k_len: int):
    """keep as (batch, k_len) when it only masks keys (same for every head and query)."""
    if keep is None:
        return jnp.ones((batch, k_len), dtype=bool)
    keep = as_4d(keep)
    if keep.shape[1] != 1 or keep.shape[2] != 1:
        return None
    return jnp.broadcast_to(keep[:, 0, 0, :], (batch, k_len))


def splash(q, k, v, keep=None, *, scale: float, block_q: int = 512, block_kv: int = 512,
           platform: str | None = None, **_):
    """The Pallas TPU splash-attention kernel: compiled by Mosaic for a TPU (``platform``,
    the one the program is compiled for, whatever the host), interpreted elsewhere.

    Key-padding masks become segment ids (padded and masked keys in segment 0,
    every query in segment 1); any other mask falls back to ``blockwise``.
    """
    batch, _, q_len, _ = q.shape
    padding = key_padding(keep, batch, k.shape[2])
    if padding is None:
        return blockwise(q, k, v, keep, scale=scale, block_q=block_q, block_kv=block_kv)
    out = _splash_call(q, k, v, padding, scale, block_q, block_kv, platform)
    # a query whose keys are all masked: splash leaves garbage, reference gives zeros
    any_kept = jnp.any(padding, axis=1)[:, None, None, None]
    return jnp.where(any_kept, out[:, :, :q_len], 0).astype(q.dtype)


def splash_share(q, k, v, *, scale: float, block_q: int = 512, block_kv: int = 512,
                 platform: str | None = None):
    """Splash on one share of a ring's keys and values: the output and each query's
    log-sum-exp of its scaled scores (the kernel's residual), both float32, which the
    ring merges shares by (``ring.attend``). No mask: the ring runs unmasked calls."""
    batch, _, q_len, _ = q.shape
    keys = jnp.ones((batch, k.shape[2]), bool)
    out, (logsumexp,) = _splash_call(q, k, v, keys, scale, block_q, block_kv, platform,
                                     residuals=True)
    return out[:, :, :q_len].astype(jnp.float32), logsumexp[:, :, :q_len]


def _splash_call(q, k, v, padding, scale, block_q, block_kv, platform, residuals=False):
    """Splash on (B, H, S, D) arrays padded to its blocks, ``padding`` (batch, keys) the
    keys each query may see; the padded queries' rows are left for the caller to drop."""
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as kernel_lib,
    )
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_mask as mask_lib,
    )

    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    interpret = (platform or jax.default_backend()) != "tpu"
    # splash wants block multiples of 128 (the TPU lane width)
    block_q = min(block_q, _round_up(q_len, 128))
    block_kv = min(block_kv, _round_up(k_len, 128))
    # Mosaic has no float16 vector loads on TPU ("Invalid vector type for load"):
    # float16 attention (CogVideoX-2b's recipe) runs in float32 inside the kernel
    wide = jnp.float32 if q.dtype == jnp.float16 else q.dtype
    qp = pad((q * jnp.asarray(scale, q.dtype)).astype(wide), 2, block_q)  # splash does
    kp, vp = pad(k.astype(wide), 2, block_kv), pad(v.astype(wide), 2, block_kv)  # not scale q
    segments = kernel_lib.SegmentIds(
        q=jnp.ones((batch, qp.shape[2]), jnp.int32),
        kv=pad(padding.astype(jnp.int32), 1, block_kv))
    mask = mask_lib.MultiHeadMask(
        [mask_lib.FullMask((qp.shape[2], kp.shape[2])) for _ in range(heads)])
    sizes = kernel_lib.BlockSizes(block_q=block_q, block_kv=block_kv,
                                  block_kv_compute=block_kv)
    attend = kernel_lib.make_splash_mha_single_device(
        mask=mask, block_sizes=sizes, save_residuals=residuals, interpret=interpret)
    return jax.vmap(attend)(qp, kp, vp, segments)


def _round_up(n: int, multiple: int) -> int:
    return math.ceil(n / multiple) * multiple


def torch_cpu(q, k, v, keep=None, *, scale: float, **_):
    """PyTorch's fused CPU attention, called from the compiled program on the host.

    On CPU, JAX arrays already live in host memory: through ``buffer_callback``
    PyTorch reads q, k and v in place and writes into the program's output
    buffer, so the only copy is PyTorch's result into it (``pure_callback``
    copied every input and cost ~90 ms per call at 8k tokens). Its flash kernel
    (blockwise, vectorised exp) beats both XLA formulations. A host callback
    makes JAX skip its persistent compile cache for the whole program, hence
    ``auto`` only picks this where attention is big enough for step time to
    matter more than compile time.
    """
    from jax.experimental.buffer_callback import buffer_callback

    batch, heads, q_len, _ = q.shape
    args = (q, k, v) if keep is None else (q, k, v, _block_keep(keep, batch, heads, q_len,
                                                                 k.shape[2]))
    call = buffer_callback(partial(_torch_sdpa, scale=scale),
                           jax.ShapeDtypeStruct(q.shape, q.dtype), vmap_method="sequential")
    out = call(*args)
    if keep is None:
        return out
    # a query whose keys are all masked: PyTorch gives NaN, reference gives zeros
    any_kept = jnp.any(args[3], axis=-1, keepdims=True)
    return jnp.where(any_kept, out, 0).astype(q.dtype)


def _torch_sdpa(_context, out, q, k, v, keep=None, *, scale: float):
    """Write PyTorch's attention of the XLA buffers q, k, v into the XLA buffer ``out``."""
    import torch

    with torch.no_grad():
        tensors = [torch.from_dlpack(x) for x in (q, k, v)]
        mask = None if keep is None else torch.from_dlpack(keep)
        torch.from_dlpack(out).copy_(torch.nn.functional.scaled_dot_product_attention(
            *tensors, attn_mask=mask, scale=scale))


def cudnn(q, k, v, keep=None, *, scale: float, **_):
    """cuDNN fused attention through jax.nn.dot_product_attention (GPU, 16-bit)."""
    layout = (0, 2, 1, 3)  # jax.nn wants (batch, sequence, heads, dim)
    mask = None if keep is None else jnp.asarray(keep, dtype=bool)
    out = jax.nn.dot_product_attention(
        q.transpose(layout), k.transpose(layout), v.transpose(layout), mask=mask,
        scale=scale, implementation="cudnn")
    return out.transpose(layout)
