"""TPU chips' public facts, per JAX device: memory, bandwidths and peak rates by
operand type. ``porter compile`` bounds a step's time with them, and the quantize pass
reads from them which 8-bit matmul a TPU runs faster than bfloat16 (one table, so the
two never disagree).

A fact is per JAX device: one chip for v5e and v6e (one TensorCore), one chip for v4
and v5p (two TensorCores in megacore mode), half a chip for TPU7x (its two TensorCores
are two devices, each with half the chip's HBM and rates).
"""

from __future__ import annotations

from dataclasses import dataclass, field

GiB = 2**30


@dataclass(frozen=True)
class Chip:
    """One JAX device's public facts (sources in ``source``)."""

    name: str  # as XLA names the device kind
    hbm_bytes: int  # HBM capacity as published
    usable_hbm_bytes: int  # what the compiler lets a program use (its refusals say so)
    peak_bf16_flops: float  # dense bfloat16 FLOP/s
    hbm_bytes_per_s: float
    ici_bytes_per_s: float  # inter-chip interconnect, as published
    source: str
    #: 8-bit matmul kinds ("int8", "fp8") whose published peak beats bfloat16's, with it
    peak_8bit: dict = field(default_factory=dict)
    #: 8-bit kinds with no published rate at all (neither faster nor not): the user's call
    unpublished: tuple = ()

    def peak(self, operand: str) -> float:
        """Peak rate of a matmul on ``operand``s ("bf16", "int8", "fp8", "f32", ...):
        the published 8-bit peak where there is one, else bfloat16's (f32 matmuls run
        as bf16 passes; a lower bound counts them at bf16's rate, and an unpublished
        8-bit rate at bf16's too, so the bound is a bound only where it is no faster)."""
        return self.peak_8bit.get(operand, self.peak_bf16_flops)

    @property
    def faster(self) -> set[str]:
        return set(self.peak_8bit)


CHIPS = {
    # v4's int8 peak is its bf16 peak (275 TOP/s): no 8-bit format gains there
    "v4": Chip("TPU v4", 32 * GiB, int(30.75 * GiB), 275e12, 1200e9, 2400e9 / 8,
               "https://cloud.google.com/tpu/docs/v4 (275 TFLOP/s bf16 and int8; 32 GiB, "
               "1200 GBps); ICI 2400 Gbps per chip: https://cloud.google.com/blog/products/"
               "ai-machine-learning/introducing-cloud-tpu-v5p-and-ai-hypercomputer"),
    "v5e": Chip("TPU v5 lite", 16 * GiB, int(15.75 * GiB), 197e12, 819e9, 400e9,
                "https://cloud.google.com/tpu/docs/v5e (197 TFLOP/s bf16, 394 TOP/s int8; "
                "16 GB, 819 GBps; 400 GBps bidirectional ICI per chip)",
                {"int8": 394e12}),
    "v5p": Chip("TPU v5", 95 * GiB, int(95.74 * GiB), 459e12, 2765e9, 4800e9 / 8,
                "https://cloud.google.com/tpu/docs/v5p (459 TFLOP/s bf16, 918 TOP/s int8; "
                "95 GB, 2765 GBps; ICI 4800 Gbps per chip)", {"int8": 918e12}),
    "v6e": Chip("TPU v6 lite", 32 * GiB, int(31.25 * GiB), 918e12, 1638e9, 800e9,
                "https://cloud.google.com/tpu/docs/v6e (918 TFLOP/s bf16, 1836 TOP/s int8, "
                "fp8 at the bf16 rate; 32 GB, 1638 GBps; 800 GBps bidirectional ICI per "
                "chip)", {"int8": 1836e12}),
    # a TPU7x chip is two devices: each holds half its 192 GiB, 7380 GBps, 2307 TFLOP/s
    # bf16 and 4614 fp8, and shares its 1200 GBps of ICI; the page publishes no int8
    # rate. Usable HBM: the compiler's refusal of a larger program (libtpu 0.10.2).
    "v7x": Chip("TPU7x", 96 * GiB, int(94.75 * GiB), 2307e12 / 2, 7380e9 / 2, 1200e9 / 2,
                "https://cloud.google.com/tpu/docs/tpu7x (per chip: 2307 TFLOP/s bf16, "
                "4614 fp8; 192 GiB, 7380 GBps; 1200 GBps bidirectional ICI; two "
                "TensorCores, each a JAX device: the figures here are halves)",
                {"fp8": 4614e12 / 2}, unpublished=("int8",)),
}


#: device kinds other JAX and libtpu versions report for the same chips
OTHER_NAMES = {"TPU v5e": "v5e", "TPU v5p": "v5p", "TPU v6e": "v6e", "TPU v7x": "v7x",
               "TPU v7": "v7x"}


def by_kind(device_kind: str) -> Chip | None:
    """The chip a JAX device kind names (None: not a TPU this table knows)."""
    if device_kind in OTHER_NAMES:
        return CHIPS[OTHER_NAMES[device_kind]]
    return next((chip for chip in CHIPS.values() if chip.name == device_kind), None)
