"""The low-precision formats: how a weight's rows become 8-bit values and their scales,
and which chips run each format's matmul faster than bfloat16.

Weights are scaled per output channel (one float32 scale per row of a linear layer's
``(out, in)`` weight): a row's scale needs only that row, so a process that reads
only the rows its devices hold quantizes them exactly as a whole read would.
Activations (``fp8``, ``int8``) are scaled per token, computed in the program on the
fly (dynamic: no calibration data).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from porter.runtime import chips
from porter.shims import lazy

torch = lazy.module("torch", __name__)

#: the weight's scales sit beside it, named after it: sharding places them by its rows
SCALE = "weight_scale"

#: the smallest scale: an all-zero row quantizes to zeros, not to NaN
TINY = 1e-12


@dataclass(frozen=True)
class Format:
    name: str
    weight: str  # the stored weights' dtype (torch's name for it)
    largest: float  # the largest magnitude it holds: a row's amax maps to it
    activations: bool  # are activations quantized too (a low-precision matmul)?
    kind: str  # "fp8" or "int8": what a chip must run faster for the matmul to gain
    #: ``porter verify``'s default bound (max |diff| / max |reference| per block) for a
    #: port in this format: Wan 1.3B's published layout with random weights, 30 blocks,
    #: measured 3.0e-2 (int8) and 4.6e-2 (fp8) at its last block (docs/quantize.md)
    tolerance: float

    def quantize(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(values, scales) of a weight's rows: ``values * scales[:, None]`` is the
        weight, to within the format's rounding."""
        wide = rows.to(torch.float32, copy=True)  # one copy, worked on in place
        scale = (wide.abs().amax(dim=1) / self.largest).clamp(min=TINY)
        scaled = wide.div_(scale[:, None]).clamp_(-self.largest, self.largest)
        if self.weight == "int8":
            scaled = scaled.round_()
        return scaled.to(self.weight_dtype), scale

    @property
    def weight_dtype(self) -> torch.dtype:
        return getattr(torch, self.weight)



FORMATS = {
    "fp8": Format("fp8", "float8_e4m3fn", 448.0, True, "fp8", 8e-2),
    "int8": Format("int8", "int8", 127.0, True, "int8", 5e-2),
    "fp8-weights": Format("fp8-weights", "float8_e4m3fn", 448.0, False, "fp8", 8e-2),
    "int8-weights": Format("int8-weights", "int8", 127.0, False, "int8", 5e-2),
}

# Which 8-bit matmul a GPU runs faster than bfloat16, by its JAX device kind: the tensor
# cores' formats (fp8 from Ada and Hopper on: an fp8 dot measured 1.4-1.7x bf16 on an
# H100; int8 from Turing on). TPUs: their published peaks, in porter.runtime.chips.
FASTER = (
    (r"H100|H200|H800|H20\b|GH200|B200|GB200|B100|L40|L4\b|RTX 40|RTX 50|RTX PRO|Ada\b",
     {"fp8", "int8"}),  # Hopper, Ada, Blackwell (checked first: "RTX 2000 Ada")
    (r"A100|A800|A10G?\b|A30|A40|RTX 30|RTX A\d|T4\b|RTX 20", {"int8"}),
)

#: the format ``auto`` means on a chip, by the kind it runs faster (fp8 first)
AUTO_ORDER = ("fp8", "int8")


def faster(device_kind: str) -> set[str] | None:
    """The 8-bit matmul kinds ``device_kind`` runs faster than bfloat16 (None: a chip
    these tables do not know)."""
    tpu = chips.by_kind(device_kind)
    if tpu is not None:
        return tpu.faster
    for pattern, kinds in FASTER:
        if re.search(pattern, device_kind):
            return kinds
    return None


def resolve(name: str, platform: str, device_kind: str) -> tuple[Format | None, str]:
    """The format a recipe's ``quantize.format`` means on this chip, and why not when
    it is None: ``auto`` takes the chip's faster kind; a full format (weights and
    activations) needs a chip that runs its matmul faster, since anywhere else it
    costs fidelity for nothing (weights-only formats halve memory anywhere). The CPU
    backend runs every format: it is where fidelity is measured, not speed."""
    kinds = faster(device_kind)
    if platform == "cpu":
        kinds = {"fp8", "int8"}
    if name == "auto":
        chosen = next((kind for kind in AUTO_ORDER if kinds and kind in kinds), None)
        if chosen is None:
            return None, (f"{device_kind or platform} runs no 8-bit matmul faster than "
                          "bfloat16 (that Porter knows of)")
        return FORMATS[chosen], ""
    fmt = FORMATS[name]
    tpu = chips.by_kind(device_kind)
    unknown = kinds is None or (tpu is not None and fmt.kind in tpu.unpublished)
    if not fmt.activations or unknown or fmt.kind in kinds:
        return fmt, ""  # a chip (or a rate) nobody published: the user's call
    return None, (f"{device_kind} runs {fmt.kind} matmuls no faster than bfloat16"
                  + (f" (it runs {' and '.join(sorted(kinds))} faster)" if kinds else ""))
