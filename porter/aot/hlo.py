"""What a compiled program's HLO says about its communication: each collective's kind,
how many times it runs (a loop body's ops count once per trip) and the bytes it
moves per chip; and, for a TPU's, the compiler's own estimate of each instruction's
cycles.

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
        # async: (operands, results[, contexts]); the contexts (u32[] and s32[] scalars)
        # first, or a permute's (operand, result, u32[], u32[]) keeps only them
        data = [b for b in leaves if b > 4] or leaves
        leaves = data[len(data) // 2:]
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


#: a loop bound: a signed or unsigned integer constant (XLA's windowed matmuls, which
#: gather a weight piece by piece, count their trips in u32)
_CONSTANT = re.compile(r"%([\w.\-]+)\s*=\s*[su](?:32|64)\[\][^ ]*\s+constant\((\d+)\)")
#: a condition's compare of its counter (first) with its bound (second)
_BOUND = re.compile(r"ROOT .*compare\(%([\w.\-]+),\s*%([\w.\-]+)\),\s*direction=LT")
_ELEMENT = re.compile(r"%([\w.\-]+)\s*=\s*\S+\s+get-tuple-element\(%[\w.\-]+\),\s*index=(\d+)")
_ADD = re.compile(r"%([\w.\-]+)\s*=\s*\S+\s+add\(%([\w.\-]+),\s*%([\w.\-]+)\)")
_ALIAS = re.compile(r"%([\w.\-]+)\s*=\s*\S+\s+(?:copy|bitcast|convert)\(%([\w.\-]+)\)")
_TUPLE = re.compile(r"ROOT %[\w.\-]+ = .*?\btuple\(([^)]*)\)")


def _trips(line: str, callees: dict, computations: dict) -> int:
    """Trips of a while loop: the compiler's count where it gives one, else the bound of
    a scan-shaped condition (a counter from 0, below a constant) over the counter's
    step; 1 if neither."""
    found = _TRIPS.search(line)
    if found:
        return int(found.group(1))
    condition = computations.get(callees.get("condition", "").lstrip("%"), [])
    constants = dict(m for l in condition for m in _CONSTANT.findall(l))
    elements = dict(m for l in condition for m in _ELEMENT.findall(l))
    for l in condition:
        bound = _BOUND.search(l)
        if bound and bound.group(2) in constants:
            body = computations.get(callees.get("body", "").lstrip("%"), [])
            step = _step(body, elements.get(bound.group(1)))
            return -(-int(constants[bound.group(2)]) // step)
    return 1


def _step(body: list[str], index: str | None) -> int:
    """What a loop's body adds to its counter (tuple element ``index``) each trip: a
    constant (the TPU compiler's two-way windowed matmuls step by 2, two dots a trip),
    else 1."""
    constants = dict(m for l in body for m in _CONSTANT.findall(l))
    counters = {name for l in body for name, at in _ELEMENT.findall(l) if at == index}
    for l in body:  # the counter passed through a copy first (it is, in some loops)
        alias = _ALIAS.search(l)
        if alias and alias.group(2) in counters:
            counters.add(alias.group(1))
    outputs = next((found.group(1) for l in body if (found := _TUPLE.search(l))), None)
    if index is None or outputs is None:
        return 1
    names = [part.split("*/")[-1].strip().lstrip("%") for part in outputs.split(",")]
    if int(index) >= len(names):
        return 1
    for l in body:
        added = _ADD.search(l)
        if added and added.group(1) == names[int(index)]:
            a, b = added.group(2), added.group(3)
            step = constants.get(b) if a in counters else constants.get(a) if b in counters \
                else None
            return max(int(step), 1) if step is not None else 1
    return 1


def _multipliers(computations: dict, entry: str, trips: bool = True) -> dict[str, int]:
    """How many times each computation runs per call of the entry computation (with
    ``trips`` false: as if each loop ran once, as XLA's cost analysis counts them)."""
    times = {name: 0 for name in computations}

    def visit(name: str, count: int, depth: int = 0) -> None:
        if name not in times or depth > 64:
            return
        times[name] += count
        for line in computations[name]:
            callees = _CALLEES.findall(line)
            repeat = _trips(line, dict(callees), computations) if trips else 1
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


_CYCLES = re.compile(r'"estimated_cycles"\s*:\s*"?(\d+)')
_SOURCE = re.compile(r'op_name="([^"]*)"')
#: what a fusion is charged as: the first of these its computation holds (a fusion of
#: none of them is elementwise work)
_HEROES = (("convolution", "convolution"), ("dot", "matmul"), ("reduce-window", "pooling"),
           ("reduce", "reduction"), ("concatenate", "concatenation"), ("pad", "padding"),
           ("dynamic-update-slice", "slice"), ("dynamic-slice", "slice"), ("slice", "slice"),
           ("transpose", "layout copy"), ("gather", "gather"))
#: an unfused instruction's opcode -> what it is charged as (any other: its opcode,
#: a broadcast's, say)
_BARE = {**dict(_HEROES), "copy": "layout copy", "custom-call": "kernel"}


def _charged_as(opcode: str, line: str, computations: dict) -> str:
    """What an instruction is charged as: a fusion by the heaviest operation inside it
    (its hero), anything else by its opcode, the same names either way."""
    if opcode != "fusion":
        return _BARE.get(opcode, opcode)
    called = dict(_CALLEES.findall(line)).get("calls", "").lstrip("%")
    body = "\n".join(computations.get(called, []))
    return next((label for op, label in _HEROES if re.search(rf"\s{re.escape(op)}\(", body)),
                "elementwise")


@dataclass
class Estimate:
    """One instruction the TPU compiler estimated: its cycles a call (times the trips of
    the loops it is in), what it is charged as, and the PyTorch operation it came from
    (the source op's name the program's metadata keeps)."""

    name: str
    kind: str
    cycles: int
    source: str


def estimated_cycles(text: str) -> list[Estimate]:
    """The TPU compiler's own estimate of each scheduled instruction's cycles (its
    backend config's ``estimated_cycles``), from an optimized HLO module; empty for a
    module without them (another backend's, or an unoptimized one). Their sum is a
    serial estimate of the program's time on one core: what runs asynchronously
    (copies and collectives started and awaited) carries no cycles of its own."""
    computations, entry = _computations(text)
    if entry is None:
        return []
    times = _multipliers(computations, entry)
    found = []
    for name, lines in computations.items():
        for line in lines:
            cycles, match = _CYCLES.search(line), _INSTRUCTION.match(line)
            if cycles is None or match is None or not times.get(name):
                continue
            source = _SOURCE.search(line)
            found.append(Estimate(line.split("=")[0].strip().removeprefix("ROOT ")
                                  .lstrip("%"), _charged_as(match.group(2), line, computations),
                                  int(cycles.group(1)) * times[name],
                                  source.group(1) if source else ""))
    return found


#: custom calls whose work the compiler's cost analysis does not count (Pallas kernels
#: compiled by Mosaic for a TPU, cuDNN's fused attention)
OPAQUE_TARGETS = ("tpu_custom_call", "__cudnn$fmha")


def opaque_kernels(text: str) -> int:
    """How many custom-call kernels the program runs whose FLOPs XLA cannot count."""
    return sum(text.count(f'custom_call_target="{target}') for target in OPAQUE_TARGETS)


_PARAM = re.compile(r"%?([\w.\-]+):\s*((?:\w+\[[0-9,]*\])|\([^)]*\))")
_RESULT = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\S+)\s")
_OPERANDS = re.compile(r"\b(?:convolution|dot)\(([^)]*)\)")
_LABELS = re.compile(r"dim_labels=([\w]+)_([\w]+)->([\w]+)")
_WINDOW_ATTRS = re.compile(r"window=\{([^}]*)\}")
_GROUPS = re.compile(r"feature_group_count=(\d+)")
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([0-9,]*)\}")


def _dims(shape: str) -> list[int]:
    found = _ARRAY.search(shape)
    return [int(d) for d in found.group(2).split(",") if d] if found else []


def _matmul_flops(line: str, shapes: dict) -> float:
    """FLOPs of one convolution or dot instruction (2 per multiply-add)."""
    result = _RESULT.match(line)
    operands = _OPERANDS.search(line)
    if result is None or operands is None:
        return 0.0
    names = [n.strip().lstrip("%") for n in operands.group(1).split(",")]
    lhs = _dims(shapes.get(names[0], "")) if names else []
    out = math.prod(_dims(result.group(2)))
    labels = _LABELS.search(line)
    if labels and lhs:  # convolution: lhs feature dim, times the window
        feature = lhs[labels.group(1).index("f")] if "f" in labels.group(1) else 1
        groups = int(_GROUPS.search(line).group(1)) if _GROUPS.search(line) else 1
        return 2.0 * out * feature / groups * _taps(line, lhs, labels.group(1))
    contracting = _CONTRACTING.search(line)
    if contracting and lhs:
        return 2.0 * out * math.prod(lhs[int(i)] for i in contracting.group(1).split(",") if i)
    return 0.0


def _taps(line: str, lhs: list[int], lhs_labels: str) -> float:
    """Window positions that meet an input value, per output element, on average: a
    window's positions over padding or between a dilated input's values meet none
    (XLA writes a batched matmul as a convolution whose batch is a window over an
    input dilated by its size, one tap; and a matmul split over chips as a window over
    an input padded on both sides, one tap of the window's width)."""
    window = _WINDOW_ATTRS.search(line)
    if window is None:
        return 1.0
    attrs = dict(item.split("=", 1) for item in window.group(1).split())
    sizes = [int(n) for n in attrs["size"].split("x")]
    count = len(sizes)
    spatial = [lhs[lhs_labels.index(str(d))] if str(d) in lhs_labels else 1
               for d in range(count)]
    strides = [int(n) for n in attrs.get("stride", "x".join(["1"] * count)).split("x")]
    dilate = [int(n) for n in attrs.get("lhs_dilate", "x".join(["1"] * count)).split("x")]
    pads = [tuple(int(v) for v in p.split("_")) for p in
            attrs.get("pad", "x".join(["0_0"] * count)).split("x")]
    spread = [int(n) for n in attrs.get("rhs_dilate", "x".join(["1"] * count)).split("x")]
    taps = 1.0
    for size, length, stride, step, (low, high), gap in zip(sizes, spatial, strides,
                                                            dilate, pads, spread):
        extent = (length - 1) * step + 1 + low + high
        reach = (size - 1) * gap + 1  # a dilated window's span
        outputs = max(1, (extent - reach) // stride + 1)
        met = sum(1 for o in range(outputs) for k in range(size)
                  if (o * stride + k * gap - low) % step == 0
                  and 0 <= (o * stride + k * gap - low) // step < length)
        taps *= met / outputs
    return taps


#: elementwise operations XLA's cost analysis counts as one FLOP per element
#: (transcendentals, exp or tanh, it counts apart, not as FLOPs)
ELEMENTWISE = frozenset({
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "negate", "abs",
    "compare", "select", "clamp", "and", "or", "xor", "not", "convert", "remainder",
    "sign", "floor", "ceil", "round-nearest-even", "round-nearest-afz"})


def repeated_flops(text: str) -> float:
    """The FLOPs that loops add beyond one trip of each: what XLA's cost analysis, which
    counts a loop body once, leaves out (a scan over 40 blocks: 39 blocks). Matmuls and
    convolutions, and elementwise arithmetic; reductions are left out (within 2% of
    the unrolled program's count on a tiny Wan, where they weigh most)."""
    computations, entry = _computations(text)
    if entry is None:
        return 0.0
    headers = _headers(text)
    times = _multipliers(computations, entry)
    once = _multipliers(computations, entry, trips=False)
    extra = 0.0
    for name, lines in computations.items():
        surplus = times.get(name, 0) - once.get(name, 0)
        if surplus <= 0:
            continue
        shapes = _shapes(lines, headers.get(name, {}))
        extra += surplus * sum(_matmul_flops(line, shapes) for line in lines
                               if " convolution(" in line or " dot(" in line)
        extra += surplus * sum(_elementwise_flops(line) for line in lines)
    return extra


#: an HLO element type -> the operand kind a chip's peak is published for
_KINDS = {"s8": "int8", "u8": "int8", "s4": "int8", "u4": "int8", "bf16": "bf16",
          "f16": "f16", "f32": "f32", "f64": "f64"}


def _kind(hlo_type: str) -> str:
    return "fp8" if hlo_type.startswith("f8") else _KINDS.get(hlo_type, hlo_type)


def _operand_kind(line: str, shapes: dict) -> str:
    """The operand type a dot or convolution runs on: both operands' when they agree,
    else the wider one's (a mixed dot runs at the wider type's rate)."""
    operands = _OPERANDS.search(line)
    names = [n.strip().lstrip("%") for n in operands.group(1).split(",")][:2] \
        if operands else []
    kinds = [_kind(found.group(1)) for found in
             (_ARRAY.search(shapes.get(name, "")) for name in names) if found]
    if not kinds:
        return "unknown"
    order = ("int8", "fp8", "bf16", "f16", "f32", "f64")
    return max(kinds, key=lambda k: order.index(k) if k in order else len(order))


def matmul_flops(text: str) -> dict[str, float]:
    """Operand kind ("bf16", "int8", "fp8", "f32") -> the FLOPs of the program's dots
    and convolutions on it, per call, every trip of every loop counted: what the
    compiler left of a low-precision matmul (an 8-bit dot it widened shows as bf16)."""
    computations, entry = _computations(text)
    if entry is None:
        return {}
    headers = _headers(text)
    times = _multipliers(computations, entry)
    found: dict[str, float] = {}
    for name, lines in computations.items():
        if not times.get(name):
            continue
        shapes = _shapes(lines, headers.get(name, {}))
        for line in lines:
            if " convolution(" in line or " dot(" in line:
                flops = _matmul_flops(line, shapes)
                if flops:
                    kind = _operand_kind(line, shapes)
                    found[kind] = found.get(kind, 0.0) + flops * times[name]
    return found


def _elementwise_flops(line: str) -> float:
    match = _INSTRUCTION.match(line)
    if match is None or match.group(2) not in ELEMENTWISE:
        return 0.0
    arrays = _ARRAY.findall(match.group(1))
    return float(math.prod(int(d) for d in arrays[0][1].split(",") if d)) if arrays else 0.0


def _shapes(lines: list[str], parameters: dict) -> dict[str, str]:
    """Value name -> its HLO shape in one computation: its parameters' and results'."""
    shapes = dict(parameters)
    for line in lines:
        result = _RESULT.match(line)
        if result:
            shapes[result.group(1)] = result.group(2)
    return shapes


def _headers(text: str) -> dict[str, dict[str, str]]:
    """Computation -> its parameters' shapes, from its header line."""
    found = {}
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header and "=" not in line.split("{")[0].split("(")[0]:
            inside = line[line.find("(") + 1:line.rfind("->")]
            found[header.group(2)] = dict(_PARAM.findall(inside))
    return found
