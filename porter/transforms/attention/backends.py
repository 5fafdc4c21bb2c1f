"""Attention backends: named kernels plugins can add to, and how ``auto`` picks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from porter.transforms.attention import kernels


@dataclass(frozen=True)
class AttentionBackend:
    name: str
    kernel: Callable  # kernel(q, k, v, keep, *, scale, block_q, block_kv) on (B, H, S, D)
    doc: str
    platforms: tuple[str, ...] = ("cpu", "gpu", "tpu")  # where it can run


BUILTIN = (
    AttentionBackend("reference", kernels.reference,
                     "softmax(QK^T)V in XLA; every score materialised (memory ~ S^2)"),
    AttentionBackend("blockwise", kernels.blockwise,
                     "pure-JAX online softmax over key/value blocks; memory ~ block_q x "
                     "block_kv; runs everywhere"),
    AttentionBackend("splash", kernels.splash,
                     "Pallas TPU splash attention (interpret mode off TPU: slow, for tests)"),
    AttentionBackend("cudnn", kernels.cudnn,
                     "cuDNN fused attention via jax.nn.dot_product_attention; GPU, "
                     "bfloat16/float16", platforms=("gpu",)),
)

# On CPU, materialising the scores is fastest while they fit comfortably
# (measured: Wan-shaped 2k-token step 1.06x PyTorch with reference, 1.24x with
# blockwise); past this many float32 score bytes per call, blockwise.
AUTO_BLOCKWISE_FROM_BYTES = 2**30


def choose(name: str, platform: str, q_len: int, k_len: int, registry: dict,
           batch_heads: int = 1):
    """The backend to run: ``name`` itself, or what ``auto`` picks for the platform."""
    if name != "auto":
        return registry[name]
    if platform == "tpu":
        return registry["splash"]
    if platform == "gpu":
        return registry["cudnn"]
    scores = batch_heads * q_len * k_len * 4
    return registry["blockwise" if scores >= AUTO_BLOCKWISE_FROM_BYTES else "reference"]
