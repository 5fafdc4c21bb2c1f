"""A linear layer whose weights are 8-bit, and its matmul on the low-precision operands.

The matmul is one ``jax.lax.dot_general`` on 8-bit operands with
``preferred_element_type``: on an H100 an fp8 dot becomes a cuBLASLt fp8 GEMM
(1.4-1.7x a bfloat16 dot at Wan's shapes) and int8 x int8 -> int32 runs 1.2-1.6x,
while dequantizing the weights first and multiplying in bfloat16 gains nothing.
The scales are applied to the product: ``(x / sx) . (w / sw)^T * sx * sw`` is
``x . w^T`` to within the rounding, since each scale belongs to a row of one
operand (a token of ``x``, an output channel of ``w``).
"""

from __future__ import annotations

import torch

from porter.transforms.quantize.formats import FORMATS, SCALE, TINY, Format


class QuantizedLinear(torch.nn.Module):
    """``torch.nn.Linear``'s place and names (``weight``, ``bias``) with the weight in an
    8-bit format and ``weight_scale`` (float32, one per output channel) beside it.
    Runs under torchax only: its matmul is a JAX program."""

    def __init__(self, linear: torch.nn.Linear, fmt: Format):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.format = fmt.name
        weight = linear.weight
        if weight.is_meta:  # read from the checkpoint at placement, quantized as read
            values = torch.empty(weight.shape, dtype=fmt.weight_dtype, device="meta")
            scale = torch.empty(weight.shape[0], dtype=torch.float32, device="meta")
        else:
            values, scale = fmt.quantize(weight.detach())
        self.register_buffer("weight", values)
        self.register_buffer(SCALE, scale)
        self.bias = linear.bias  # stays in the model's dtype

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"format={self.format}")

    def forward(self, x):
        from torchax.interop import call_jax

        return call_jax(matmul, x, self.weight, self.weight_scale, self.bias,
                        FORMATS[self.format])


def matmul(x, weight, scale, bias, fmt: Format):
    """``x @ dequantized(weight).T + bias`` in ``x``'s dtype, from the 8-bit operands."""
    import jax
    import jax.numpy as jnp

    contract = (((x.ndim - 1,), (1,)), ((), ()))
    if fmt.activations:
        wide = x.astype(jnp.float32)
        token = jnp.maximum(jnp.max(jnp.abs(wide), axis=-1, keepdims=True) / fmt.largest,
                            TINY)
        scaled = jnp.clip(wide / token, -fmt.largest, fmt.largest)
        if fmt.kind == "int8":
            operand, accumulate = jnp.round(scaled).astype(jnp.int8), jnp.int32
        else:  # fp8: bfloat16 out, as measured (cuBLASLt accumulates in float32)
            operand, accumulate = scaled.astype(weight.dtype), jnp.bfloat16
        product = jax.lax.dot_general(operand, weight, contract,
                                      preferred_element_type=accumulate)
        out = product.astype(jnp.float32) * token * scale
    else:  # weights only: bfloat16 (or the model's dtype) activations
        product = jax.lax.dot_general(x, weight.astype(x.dtype), contract,
                                      preferred_element_type=jnp.float32)
        out = product * scale
    if bias is not None:
        out = out + bias.astype(jnp.float32)
    return out.astype(x.dtype)
