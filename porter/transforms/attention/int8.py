"""int8 attention for TPU: a Pallas kernel whose Q.K^T is an int8 x int8 -> int32 dot
(v5e and v6e run int8 at twice bfloat16's rate), its P.V in bfloat16, compiled by
Mosaic for a TPU and interpreted elsewhere (tests).

The scheme is SageAttention's: k is smoothed by its mean over tokens (a constant
vector added to every key adds the same amount to all of a query's scores, which the
softmax ignores, and the keys' range shrinks), then q and k are scaled into int8 per
block of tokens (one scale a block: its largest magnitude maps to 127). The kernel is
flash attention: for each query block it walks the key blocks with an online softmax
in float32, the int32 scores times the two blocks' scales, and ``P.V`` in bfloat16.
Keys padded to a block multiple are masked; padded queries are dropped. Masks other
than none run ``blockwise`` (Wan's self-attention has none).
"""

from __future__ import annotations

import functools

from porter.shims import lazy
from porter.transforms.attention import kernels

jax = lazy.module("jax", __name__)
jnp = lazy.module("jax.numpy", __name__)

#: ``porter verify``'s default bound for a port with int8 attention (as for fp8)
TOLERANCE = 8e-2
LANES = 128  # the TPU's vector lanes: the running max and sum are kept this wide


def quantized(x, block: int):
    """(x in int8, one float32 scale per block of ``block`` tokens): x of (BH, S, D),
    S a multiple of ``block``; scales (BH * S / block,), flat (for scalar memory)."""
    heads, length, dim = x.shape
    blocks = x.astype(jnp.float32).reshape(heads, length // block, block, dim)
    scale = jnp.maximum(jnp.max(jnp.abs(blocks), axis=(2, 3)), 1e-12) / 127.0
    values = jnp.round(blocks / scale[:, :, None, None]).astype(jnp.int8)
    return values.reshape(x.shape), scale.reshape(-1)


def int8_pallas(q, k, v, keep=None, *, scale: float, block_q: int = 512,
                block_kv: int = 512, platform: str | None = None, **_):
    """Attention with int8 Q.K^T (see the module). q, k, v: (B, H, S, D)."""
    if keep is not None:
        return kernels.blockwise(q, k, v, keep, scale=scale, block_q=block_q,
                                 block_kv=block_kv)
    return _attend(q, k, v, scale, block_q, block_kv, platform)[0].astype(q.dtype)


def int8_share(q, k, v, *, scale: float, block_q: int = 512, block_kv: int = 512,
               platform: str | None = None):
    """The kernel on one share of a ring's keys and values: the output and each
    query's log-sum-exp of its scaled scores, both float32, which the ring merges
    shares by (``ring.attend``). Each share's keys are smoothed by their own mean, so
    its scores are short of the true ones by q.mean for each query: added back, the
    shares' log-sum-exps compare."""
    out, logsumexp, mean = _attend(q, k, v, scale, block_q, block_kv, platform,
                                   residuals=True)
    shift = jnp.einsum("bhsd,bhd->bhs", q.astype(jnp.float32) * scale, mean)
    return out.astype(jnp.float32), logsumexp + shift


def _attend(q, k, v, scale, block_q, block_kv, platform, residuals=False):
    """(output, the log-sum-exps or None, the keys' mean): the kernel's call."""
    batch, heads, q_len, dim = q.shape
    k_len = k.shape[2]
    # blocks of whole lanes (a recipe's block_q may be any size), no longer than needed
    block_q = kernels._round_up(min(block_q, q_len), LANES)
    block_kv = kernels._round_up(min(block_kv, k_len), LANES)
    k = k.astype(jnp.float32)
    mean = jnp.mean(k, axis=2)
    k = k - mean[:, :, None]  # smoothed: the softmax does not see it

    def flat(x, block):
        return kernels.pad(x, 2, block).reshape(batch * heads, -1, dim)

    q8, q_scale = quantized(flat(q.astype(jnp.float32) * scale, block_q), block_q)
    k8, k_scale = quantized(flat(k, block_kv), block_kv)
    found = _call(q8, k8, flat(v.astype(jnp.bfloat16), block_kv), q_scale, k_scale,
                  block_q=block_q, block_kv=block_kv, k_len=k_len, residuals=residuals,
                  interpret=(platform or jax.default_backend()) != "tpu")
    out = found[0].reshape(batch, heads, -1, dim)[:, :, :q_len]
    logsumexp = found[1][:, :, 0].reshape(batch, heads, -1)[:, :, :q_len] \
        if residuals else None
    return out, logsumexp, mean


def _call(q8, k8, v, q_scale, k_scale, *, block_q: int, block_kv: int, k_len: int,
          interpret: bool, residuals: bool = False):
    """(output,) or (output, log-sum-exps): the log-sum-exps (heads, queries, LANES)
    lane-wide, as the kernel keeps its running max and sum."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    heads, q_pad, dim = q8.shape
    nq, nk = q_pad // block_q, k8.shape[1] // block_kv
    kernel = functools.partial(_kernel, nq=nq, nk=nk, block_kv=block_kv, k_len=k_len,
                               residuals=residuals)
    outputs = [(pl.BlockSpec((None, block_q, dim), lambda h, i, j, *_: (h, i, 0)),
                jax.ShapeDtypeStruct(q8.shape, jnp.bfloat16))]
    if residuals:
        outputs.append((pl.BlockSpec((None, block_q, LANES), lambda h, i, j, *_: (h, i, 0)),
                        jax.ShapeDtypeStruct((heads, q_pad, LANES), jnp.float32)))
    grid = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2, grid=(heads, nq, nk),
        in_specs=[pl.BlockSpec((None, block_q, dim), lambda h, i, j, *_: (h, i, 0)),
                  pl.BlockSpec((None, block_kv, dim), lambda h, i, j, *_: (h, j, 0)),
                  pl.BlockSpec((None, block_kv, dim), lambda h, i, j, *_: (h, j, 0))],
        out_specs=[spec for spec, _ in outputs],
        scratch_shapes=[pltpu.VMEM((block_q, LANES), jnp.float32),
                        pltpu.VMEM((block_q, LANES), jnp.float32),
                        pltpu.VMEM((block_q, dim), jnp.float32)])
    return pl.pallas_call(
        kernel, grid_spec=grid, out_shape=[shape for _, shape in outputs],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret)(q_scale, k_scale, q8, k8, v)


def _kernel(q_scale_ref, k_scale_ref, q_ref, k_ref, v_ref, *refs, nq: int, nk: int,
            block_kv: int, k_len: int, residuals: bool):
    from jax.experimental import pallas as pl

    if residuals:
        o_ref, lse_ref, peak_ref, total_ref, acc_ref = refs
    else:
        (o_ref, peak_ref, total_ref, acc_ref), lse_ref = refs, None

    head, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)

    @pl.when(j == 0)
    def _start():
        peak_ref[...] = jnp.full(peak_ref.shape, -jnp.inf, jnp.float32)
        total_ref[...] = jnp.zeros(total_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    scores = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                 preferred_element_type=jnp.int32).astype(jnp.float32)
    scores = scores * (q_scale_ref[head * nq + i] * k_scale_ref[head * nk + j])
    if k_len % block_kv:  # the last key block's padding
        column = jax.lax.broadcasted_iota(jnp.int32, scores.shape, 1) + j * block_kv
        scores = jnp.where(column < k_len, scores, -jnp.inf)
    previous = peak_ref[...]
    peak = jnp.maximum(previous, jnp.max(scores, axis=1, keepdims=True))
    weights = jnp.exp(scores - peak[:, :1])
    kept = jnp.exp(previous - peak)
    total_ref[...] = kept * total_ref[...] + jnp.sum(weights, axis=1, keepdims=True)
    acc_ref[...] = acc_ref[...] * kept[:, :1] + jax.lax.dot_general(
        weights.astype(jnp.bfloat16), v_ref[...], (((1,), (0,)), ((), ())),
        preferred_element_type=jnp.float32)
    peak_ref[...] = peak

    @pl.when(j == nk - 1)
    def _finish():
        o_ref[...] = (acc_ref[...] / total_ref[:, :1]).astype(o_ref.dtype)
        if lse_ref is not None:
            lse_ref[...] = peak_ref[...] + jnp.log(total_ref[...])
