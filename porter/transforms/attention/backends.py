"""Attention backends: named kernels plugins can add to, and how ``auto`` picks."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Callable

from porter.transforms.attention import fp8, int8, kernels


@dataclass(frozen=True)
class AttentionBackend:
    name: str
    kernel: Callable  # kernel(q, k, v, keep, *, scale, block_q, block_kv) on (B, H, S, D)
    doc: str
    platforms: tuple[str, ...] = ("cpu", "gpu", "tpu")  # where it can run
    #: every score of a call is in memory at once (memory ~ S^2): the plan and the
    #: memory checks count them; False: blocks of them
    materialises: bool = False
    #: platform -> preference: ``auto`` picks, among the backends that name the
    #: platform here, the most preferred (absent: never picked automatically)
    auto: dict = field(default_factory=dict, hash=False)
    #: ``auto`` picks it only for attention whose float32 scores would take at least
    #: this many bytes
    auto_from_bytes: int = 0
    #: ``porter verify``'s default bound (max |diff| / max |reference|) for a port that
    #: runs it: an approximate kernel's error, which the dtype's bound would refuse
    tolerance: float = 0.0
    #: ``requires(device)``: why the device cannot run it (None: it can), beyond its
    #: platform (a GPU generation); checked once JAX has started
    requires: Callable | None = None
    #: the operand kind of its Q.K^T matmuls where narrower than the inputs' ("int8"):
    #: ``porter compile`` counts those FLOPs at the chip's peak for the kind
    score_kind: str | None = None
    #: compiled by Mosaic on a TPU: XLA cannot partition the kernel over a mesh by
    #: itself, so a sharded recipe says which axes hold the batch and the heads
    mosaic: bool = False
    #: ``share(q, k, v, *, scale, block_q, block_kv, platform)`` -> (output in float32,
    #: each query's log-sum-exp): the kernel on one share of a ring's keys, which the
    #: ring merges (None: the ring runs Porter's online softmax in XLA)
    share: Callable | None = None


# On CPU, PyTorch's fused attention beats both XLA formulations once the
# scores are large (benchmarks/README.md), but a host callback keeps the whole
# program out of JAX's persistent compile cache. Small attention (tiny models,
# cross-attention to text) stays in XLA, so those programs are cached.
AUTO_TORCH_FROM_BYTES = 2**26

BUILTIN = (
    AttentionBackend("reference", kernels.reference,
                     "softmax(QK^T)V in XLA; every score materialised (memory ~ S^2)",
                     materialises=True, auto={"cpu": 1}),
    AttentionBackend("blockwise", kernels.blockwise,
                     "pure-JAX online softmax over key/value blocks; memory ~ block_q x "
                     "block_kv; runs everywhere"),
    AttentionBackend("splash", kernels.splash,
                     "Pallas TPU splash attention (interpret mode off TPU: slow, for tests)",
                     auto={"tpu": 10}, mosaic=True, share=kernels.splash_share),
    AttentionBackend("cudnn", kernels.cudnn,
                     "cuDNN fused attention via jax.nn.dot_product_attention; GPU, "
                     "bfloat16/float16", platforms=("gpu",), auto={"gpu": 10}),
    AttentionBackend("cudnn-fp8", fp8.cudnn_fp8,
                     "cuDNN's fused fp8 attention (q, k, v and the probabilities in e4m3, "
                     "per-tensor scales, keys smoothed); GPU with compute capability 9.0+ "
                     "(Hopper); a call with a mask runs the bfloat16 kernel",
                     platforms=("gpu",), tolerance=fp8.TOLERANCE,
                     requires=fp8.hopper_or_later),
    AttentionBackend("fp8-emulated", fp8.emulated,
                     "cudnn-fp8's arithmetic written out in XLA, every score materialised "
                     "(memory ~ S^2): its error, measured on any platform",
                     materialises=True, tolerance=fp8.TOLERANCE),
    AttentionBackend("int8", int8.int8_pallas,
                     "Pallas flash attention with int8 Q.K^T (k smoothed, q and k scaled "
                     "per block of tokens) and bfloat16 P.V; compiled by Mosaic for a TPU "
                     "(v5e and v6e run int8 at twice bfloat16's rate), interpreted "
                     "elsewhere (slow: for tests); a call with a mask runs blockwise",
                     tolerance=int8.TOLERANCE, score_kind="int8", mosaic=True,
                     share=int8.int8_share),
    AttentionBackend("torch-cpu", kernels.torch_cpu,
                     "PyTorch's fused CPU attention called from XLA on the host; CPU only; "
                     "programs using it are not kept in the persistent compile cache",
                     platforms=("cpu",), auto={"cpu": 2},
                     auto_from_bytes=AUTO_TORCH_FROM_BYTES),
)


@functools.cache
def takes_platform(kernel) -> bool:
    """Does ``kernel`` take ``platform=`` (the platform its program is compiled for)?"""
    try:
        return "platform" in inspect.signature(kernel).parameters
    except (TypeError, ValueError):
        return False


def choose(name: str, platform: str, q_len: int, k_len: int, registry: dict,
           batch_heads: int = 1):
    """The backend to run: ``name`` itself, or what ``auto`` picks for the platform: the
    registered backend (a plugin's too) that prefers it most (``AttentionBackend.auto``)
    among those whose size threshold the scores reach."""
    if name != "auto":
        return registry[name]
    scores = batch_heads * q_len * k_len * 4
    candidates = [b for b in registry.values()
                  if platform in b.auto and scores >= b.auto_from_bytes]
    if not candidates:
        raise LookupError(f"no attention backend is chosen automatically on {platform}")
    return max(candidates, key=lambda b: b.auto[platform])


def possible(name: str, platform: str, registry: dict) -> list[AttentionBackend]:
    """The backends ``name`` may run on ``platform``: itself, or each one ``auto`` may
    pick there (at some size); none for an unknown name (validate says so)."""
    if name == "auto":
        return [b for b in registry.values() if platform in b.auto]
    return [registry[name]] if name in registry else []


def for_call(section, q_len: int, k_len: int) -> str | None:
    """The backend a call runs by the recipe's ``attention`` section: ``cross_backend``
    for cross-attention (keys of another length than the queries), where it is set,
    else ``backend``."""
    if q_len != k_len and section.cross_backend is not None:
        return section.cross_backend
    return section.backend


def materialises(name: str | None, registry: dict) -> bool:
    """Does the recipe's ``attention.backend`` keep every score in memory? None (no
    backend: torchax's own lowering) does; ``auto`` picks blocks where it matters."""
    if name is None:
        return True
    backend = registry.get(name)
    return backend is not None and backend.materialises
