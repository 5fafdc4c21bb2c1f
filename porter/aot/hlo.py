"""What a compiled program's HLO says about its communication: each collective's kind,
how many times it runs (a loop body's ops count once per trip) and the bytes it
moves per chip.

Read from the optimized HLO text (``Compiled.as_text()``), where the compiler has
already chosen and combined the collectives; the async forms (``all-gather-start``
and its ``-done``) count once.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_BYTES = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
          "f8e4m3": 1, "f8e4m3b11fnuz": 1, "f8e5m2fnuz": 1, "f8e4m3fnuz": 1, "s16": 2,
          "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8,
          "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b(" + "|".join(sorted(_BYTES, key=len, reverse=True))
                    + r")\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s([a-z][\w\-]*)\(")
_CALLEES = re.compile(r"\b(calls|to_apply|body|condition|branch_computations)="
                      r"(\{[^}]*\}|%?[\w.\-]+)")
_TRIPS = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
_IOTA_GROUPS = re.compile(r"replica_groups=\[([0-9,]+)\]<=")
_LIST_GROUPS = re.compile(r"replica_groups=\{\{([0-9,]*)\}")


@dataclass
class Collective:
    kind: str
    count: int  # times it runs in one call of the program
    bytes: int  # result bytes, summed over those times
    traffic_bytes: int  # bytes each chip sends, by the ring algorithm, summed likewise


def _arrays(shape: str) -> list[int]:
    """Bytes of each array in an HLO shape (one, or a tuple's leaves)."""
    return [math.prod(int(d) for d in dims.split(",") if d) * _BYTES[kind]
            for kind, dims in _ARRAY.findall(shape)]


def _group_size(line: str, devices: int) -> int:
    found = _IOTA_GROUPS.search(line)
    if found:
        return int(found.group(1).split(",")[-1])
    found = _LIST_GROUPS.search(line)
    if found:
        return len([x for x in found.group(1).split(",") if x])
    return devices


def _moved(kind: str, leaves: list[int], group: int) -> tuple[int, int]:
    """(result bytes, bytes each chip sends) of one collective."""
    if kind in ("all-gather", "collective-permute") and len(leaves) > 1:
        leaves = leaves[len(leaves) // 2:]  # async: (operands, results[, contexts])
        leaves = [b for b in leaves if b > 4] or leaves
    size = sum(leaves)
    share = (group - 1) / group if group > 1 else 0.0
    sent = {"all-reduce": 2 * share * size, "all-gather": share * size,
            "reduce-scatter": (group - 1) * size, "all-to-all": share * size,
            "collective-permute": size}[kind]
    return size, int(sent)


def _computations(text: str) -> tuple[dict, str | None]:
    """Computation name -> its instruction lines; and the entry computation's name."""
    found, entry, current = {}, None, None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header and "=" not in line.split("{")[0].split("(")[0]:
            current = header.group(2)
            found[current] = []
            if header.group(1):
                entry = current
            continue
        if current is not None:
            if line.strip() == "}":
                current = None
            else:
                found[current].append(line)
    return found, entry


_CONSTANT = re.compile(r"%([\w.\-]+)\s*=\s*s32\[\][^ ]*\s+constant\((\d+)\)")
_BOUND = re.compile(r"ROOT .*compare\(%[\w.\-]+,\s*%([\w.\-]+)\),\s*direction=LT")


def _trips(line: str, callees: dict, computations: dict) -> int:
    """Trips of a while loop: the compiler's count where it gives one, else the bound of
    a scan-shaped condition (a counter from 0, below a constant); 1 if neither."""
    found = _TRIPS.search(line)
    if found:
        return int(found.group(1))
    condition = computations.get(callees.get("condition", "").lstrip("%"), [])
    constants = dict(m for l in condition for m in _CONSTANT.findall(l))
    for l in condition:
        bound = _BOUND.search(l)
        if bound and bound.group(1) in constants:
            return int(constants[bound.group(1)])
    return 1


def _multipliers(computations: dict, entry: str) -> dict[str, int]:
    """How many times each computation runs per call of the entry computation."""
    times = {name: 0 for name in computations}

    def visit(name: str, count: int, depth: int = 0) -> None:
        if name not in times or depth > 64:
            return
        times[name] += count
        for line in computations[name]:
            callees = _CALLEES.findall(line)
            repeat = _trips(line, dict(callees), computations)
            for key, value in callees:
                for callee in re.findall(r"%?([\w.\-]+)", value.strip("{}")):
                    visit(callee, count * (repeat if key in ("body", "condition") else 1),
                          depth + 1)

    visit(entry, 1)
    return times


def collectives(text: str, devices: int) -> dict[str, Collective]:
    """Kind -> the program's collectives of that kind (only kinds that occur)."""
    computations, entry = _computations(text)
    if entry is None:
        return {}
    times = _multipliers(computations, entry)
    found: dict[str, Collective] = {}
    for name, lines in computations.items():
        for line in lines:
            match = _INSTRUCTION.match(line)
            if match is None:
                continue
            opcode = match.group(2)
            kind = opcode.removesuffix("-start")
            if kind not in KINDS or opcode.endswith("-done") or not times[name]:
                continue
            size, sent = _moved(kind, _arrays(match.group(1)), _group_size(line, devices))
            entry_ = found.setdefault(kind, Collective(kind, 0, 0, 0))
            entry_.count += times[name]
            entry_.bytes += size * times[name]
            entry_.traffic_bytes += sent * times[name]
    return found


#: custom calls whose work the compiler's cost analysis does not count (Pallas kernels
#: compiled by Mosaic for a TPU, cuDNN's fused attention)
OPAQUE_TARGETS = ("tpu_custom_call", "__cudnn$fmha")


def opaque_kernels(text: str) -> int:
    """How many custom-call kernels the program runs whose FLOPs XLA cannot count."""
    return sum(text.count(f'custom_call_target="{target}') for target in OPAQUE_TARGETS)
