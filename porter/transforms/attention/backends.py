"""Attention backends: named kernels plugins can add to, and how ``auto`` picks."""

from __future__ import annotations

import functools
import inspect
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
    AttentionBackend("torch-cpu", kernels.torch_cpu,
                     "PyTorch's fused CPU attention called from XLA on the host; CPU only; "
                     "programs using it are not kept in the persistent compile cache",
                     platforms=("cpu",)),
)

# On CPU, PyTorch's fused attention beats both XLA formulations once the
# scores are large (benchmarks/README.md), but a host callback keeps the whole
# program out of JAX's persistent compile cache. Small attention (tiny models,
# cross-attention to text) stays in XLA, so those programs are cached.
AUTO_TORCH_FROM_BYTES = 2**26


@functools.cache
def takes_platform(kernel) -> bool:
    """Does ``kernel`` take ``platform=`` (the platform its program is compiled for)?"""
    try:
        return "platform" in inspect.signature(kernel).parameters
    except (TypeError, ValueError):
        return False


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
    return registry["torch-cpu" if scores >= AUTO_TORCH_FROM_BYTES else "reference"]
