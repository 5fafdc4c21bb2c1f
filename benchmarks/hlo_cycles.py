"""Where a compiled TPU program's time goes, by the TPU compiler's own estimates: each
scheduled instruction's ``estimated_cycles`` (``porter.aot.hlo.estimated_cycles``),
summed by what it is (convolution, matmul, layout copy, slice, padding, ...) and by the
PyTorch operation it came from.

    porter compile recipes/wan1.3b-causvid.yaml --target v6e-8 --program vae.decode_chunk --hlo hlo/
    python benchmarks/hlo_cycles.py hlo/                # every program kept there
    python benchmarks/hlo_cycles.py hlo/03-vae.decode_chunk.hlo --top 20

``porter compile``'s bound is a floor (a program's FLOPs at the chip's peak, or its
bytes at the HBM's rate, whichever is more); these are the compiler's estimate of what
its code does, instruction by instruction, added up as if nothing overlapped: where
the two disagree, the shares here say what the bound does not see (layout copies
between operations, padding, slices of a causal cache). Cycles, not seconds: the
chips' clocks are not in Porter's tables.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from porter.aot import hlo  # noqa: E402 - after the checkout is on the path


def source_op(source: str) -> str:
    """The PyTorch operation of a source op name (``jit(call_torch)/aten::convolution/
    conv_general_dilated`` -> ``aten::convolution``), else what JAX called it; the
    instructions XLA added with no source are ``(no source)``."""
    parts = [p for p in source.split("/") if p and not p.startswith("jit(")]
    if parts and parts[0].startswith(("args[", "kwargs[")):
        return "(a program input)"  # the copy of an argument into another layout
    return next((p for p in parts if "::" in p), parts[0] if parts else "(no source)")


def summary(text: str, top: int = 10) -> dict:
    """A program's estimated cycles: total, by kind, by PyTorch operation, the largest
    instructions."""
    found = hlo.estimated_cycles(text)
    by_kind, by_source = collections.Counter(), collections.Counter()
    for estimate in found:
        by_kind[estimate.kind] += estimate.cycles
        by_source[source_op(estimate.source)] += estimate.cycles
    largest = sorted(found, key=lambda e: e.cycles, reverse=True)[:top]
    return {"cycles": sum(by_kind.values()), "instructions": len(found),
            "by_kind": dict(by_kind.most_common()), "by_source": dict(by_source.most_common()),
            "largest": [(e.name, e.kind, e.cycles, source_op(e.source)) for e in largest]}


def render(name: str, found: dict, top: int) -> str:
    total = found["cycles"]
    if not total:
        return f"{name}: no cycle estimates (not a TPU compile's optimized HLO)"
    lines = [f"{name}: {total / 1e6:.2f} M cycles over {found['instructions']} instructions"]
    for title, table in (("by kind", found["by_kind"]), ("by PyTorch operation",
                                                         found["by_source"])):
        lines.append(f"  {title}:")
        lines += [f"    {cycles / 1e6:8.2f} M  {100 * cycles / total:5.1f}%  {what}"
                  for what, cycles in list(table.items())[:top]]
    lines.append("  largest instructions:")
    lines += [f"    {cycles / 1e6:8.3f} M  {kind:14s} {source:28s} {instruction}"
              for instruction, kind, cycles, source in found["largest"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="HLO files, or folders of them "
                                                 "(porter compile --hlo DIR)")
    parser.add_argument("--top", type=int, default=10, help="rows in each table")
    parser.add_argument("--json", action="store_true",
                        help="print the summaries as JSON (file path -> summary)")
    args = parser.parse_args(argv)
    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:
        parser.error(f"no such file or folder: {', '.join(missing)}")
    files = [f for p in map(Path, args.paths)
             for f in (sorted(p.glob("*.hlo")) if p.is_dir() else [p])]
    if not files:
        parser.error(f"no .hlo files in {', '.join(args.paths)}")
    # keyed by path: two compiles' folders (hlo-a/01-x.hlo, hlo-b/01-x.hlo) both show
    found = {str(path): summary(path.read_text(), args.top) for path in files}
    if args.json:
        print(json.dumps(found, indent=1))
    else:
        for name, one in found.items():
            print(render(name, one, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
