"""fp8 attention: cuDNN's fused fp8 kernel (Hopper and later), and the same arithmetic
written out in XLA so that its error can be measured anywhere.

Each of q, k, v is scaled per tensor into float8 e4m3 (its largest magnitude maps to
448, e4m3's largest). k is first smoothed by its mean over tokens (SageAttention's
step): a constant vector added to every key adds the same amount to all the scores of
a query, which the softmax ignores, and the keys' range shrinks. cuDNN then computes
``S = q k^T * scale``, the flash-attention probabilities ``P = exp(S - rowmax)`` in
[0, 1], quantizes ``P * 448`` to fp8 for the ``P v`` product, divides by the row sums
(kept in float32) and writes ``O`` in fp8 scaled by ``1 / scale_v`` (|O| <= max |v|:
a convex mix of v's rows fits the range). ``emulated`` does those steps in XLA.
"""

from __future__ import annotations

from porter.shims import lazy
from porter.transforms.attention import kernels

jnp = lazy.module("jax.numpy", __name__)

LARGEST = 448.0  # e4m3's largest finite value
TINY = 1e-12  # an all-zero tensor's scale: zeros, not NaN
#: ``porter verify``'s default bound for a port with fp8 attention, as for fp8 matmuls
#: (porter.transforms.quantize.formats): the tiny Wan measured 6.9e-3 (float32)
TOLERANCE = 8e-2
LAYOUT = (0, 2, 1, 3)  # (batch, heads, seq, dim) <-> cuDNN's (batch, seq, heads, dim)


def hopper_or_later(device) -> str | None:
    """Why ``device`` cannot run cuDNN's fp8 attention (None: it can): compute
    capability 9.0 (Hopper) or later."""
    found = getattr(device, "compute_capability", None)
    try:
        if found is None or float(found) >= 9.0:
            return None  # not told: the compiler says
    except (TypeError, ValueError):
        return None
    return (f"cuDNN's fp8 attention needs compute capability 9.0 (Hopper) or later; "
            f"{getattr(device, 'device_kind', 'this GPU')} has {found}")


def smoothed(k):
    """k less its mean over tokens: the same softmax, a narrower range to quantize."""
    return k - jnp.mean(k.astype(jnp.float32), axis=-2, keepdims=True).astype(k.dtype)


def quantized(x):
    """(x in e4m3, its float32 scale): ``values * scale`` is x to within e4m3's rounding."""
    wide = x.astype(jnp.float32)
    scale = jnp.maximum(jnp.max(jnp.abs(wide)) / LARGEST, TINY)
    return jnp.clip(wide / scale, -LARGEST, LARGEST).astype(jnp.float8_e4m3fn), scale


def cudnn_fp8(q, k, v, keep=None, *, scale: float, **_):
    """cuDNN's fused fp8 attention (GPU, compute capability 9.0 and later), inference
    form. A call with a mask runs cuDNN's bfloat16 kernel: the fp8 one takes none."""
    if keep is not None:
        return kernels.cudnn(q, k, v, keep, scale=scale)
    from jax._src.cudnn import fused_attention_stablehlo as fused  # JAX's only fp8 path

    (qf, sq), (kf, sk), (vf, sv) = (quantized(x) for x in (q, smoothed(k), v))
    one = lambda value: jnp.reshape(jnp.asarray(value, jnp.float32), (1, 1, 1, 1))  # noqa: E731
    params = {key: one(1.0) for key in fused.fp8_params_keys}  # the backward's: unused
    params.update(descale_q=one(sq), descale_k=one(sk), descale_v=one(sv),
                  scale_s=one(LARGEST), descale_s=one(1.0 / LARGEST), scale_o=one(1.0 / sv))
    out, _, _ = fused.dot_product_attention(
        qf.transpose(LAYOUT), kf.transpose(LAYOUT), vf.transpose(LAYOUT),
        fp8_params=params, scale=scale, use_fp8=True, qkv_layout="BTNH")
    return (out.astype(jnp.float32) * sv).astype(q.dtype).transpose(LAYOUT)


def emulated(q, k, v, keep=None, *, scale: float, **_):
    """What ``cudnn_fp8`` computes, step by step in XLA (every score materialised):
    for measuring fp8 attention's error on any platform, and for checking the kernel."""
    (qf, sq), (kf, sk), (vf, sv) = (quantized(x) for x in (q, smoothed(k), v))
    return emulated_from(qf, kf, vf, sq, sk, sv, keep, scale=scale).astype(q.dtype)


def emulated_from(qf, kf, vf, sq, sk, sv, keep=None, *, scale: float):
    """``emulated`` on operands already quantized (rows of q may be a subset: each
    query's output needs only its own row). Float32 out."""
    f32 = jnp.float32
    scores = jnp.einsum("bhqd,bhkd->bhqk", qf.astype(f32), kf.astype(f32)) * (sq * sk * scale)
    if keep is not None:
        scores = jnp.where(keep, scores, -jnp.inf)
    peak = jnp.max(scores, axis=-1, keepdims=True)
    weights = jnp.exp(scores - jnp.where(jnp.isfinite(peak), peak, 0.0))
    total = jnp.sum(weights, axis=-1, keepdims=True)
    probabilities = (weights * LARGEST).astype(jnp.float8_e4m3fn).astype(f32)
    mixed = jnp.einsum("bhqk,bhkd->bhqd", probabilities, vf.astype(f32)) / LARGEST
    out = mixed / jnp.where(total > 0, total, 1.0)  # in units of sv
    # the quantized probabilities can sum past the unquantized total: clip before the
    # cast (e4m3 has no infinity: past 464 a value becomes NaN)
    return jnp.clip(out, -LARGEST, LARGEST).astype(jnp.float8_e4m3fn).astype(f32) * sv
