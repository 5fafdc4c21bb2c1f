"""Where a TPU compile's time goes: the TPU compiler's code generation time per HLO
operation of one program, and per computation (a scan's loop body against the code
around it).

    python benchmarks/compile_time_by_op.py recipes/wan14b.yaml transformer.forward [KEY=VALUE ...]

Runs ``porter compile R --target v6e-8 --program P --hlo DIR`` in a fresh process with
libtpu's backend log on (``TPU_VMODULE=deepsea_compiler_backend=3``), reads the
program's optimized HLO from DIR, and charges each compiler thread's time between one operation's
"[NAME] LLO optimizing N instructions" line and that thread's next line to NAME. The
log is libtpu's, not a stable interface: a libtpu that words it differently leaves
the table empty (said, not guessed). The logging slows the compile down a little, and
the compiler runs as many threads as the host has cores, so the seconds are thread
seconds, not wall time. Code generation is most of a TPU compile (its "BACKEND_PASSES
stage duration" line, printed at the end): HLO passes take well under a second for a
Wan transformer.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# porter's CLI in this process (no child of its own: libtpu's log is this process's)
_CHILD = "import sys; from porter import cli; sys.exit(cli.main(sys.argv[1:]))"

_STAMP = re.compile(r"^[IWE]\d{4} (\d+):(\d+):([\d.]+)\s+(\d+) ")
_START = re.compile(r"\] \[([^\]]+)\] LLO optimizing")
_BACKEND = re.compile(r"BACKEND_PASSES stage duration: ([\d.]+)(m?s)")


def computations(hlo: str) -> dict[str, str]:
    """Each instruction's name -> the name of the computation it is in."""
    where, current = {}, None
    for line in hlo.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            current = line.split()[1 if line.startswith("ENTRY") else 0].lstrip("%")
        match = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = ", line)
        if match:
            where[match[1]] = current
    return where


def thread_seconds(log: str) -> collections.Counter:
    """Operation name -> compiler thread seconds, from libtpu's backend log."""
    spent, current = collections.Counter(), {}
    for line in log.splitlines():
        stamp = _STAMP.match(line)
        if not stamp:
            continue
        hours, minutes, seconds, thread = stamp.groups()
        now = int(hours) * 3600 + int(minutes) * 60 + float(seconds)
        if thread in current:
            name, since = current[thread]
            spent[name] += now - since
            current[thread] = (name, now)
        start = _START.search(line)
        if start:
            current[thread] = (start[1], now)
    return spent


def main(recipe: str, program: str, *overrides: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, "compile", recipe, "--target", "v6e-8",
             "--program", program, "--hlo", tmp, *overrides],
            capture_output=True, text=True, cwd=ROOT,
            env={**os.environ, "JAX_PLATFORMS": "cpu", "TPU_STDERR_LOG_LEVEL": "0",
                 "TPU_MIN_LOG_LEVEL": "0", "TPU_VMODULE": "deepsea_compiler_backend=3"})
        kept = sorted(Path(tmp).glob("*.hlo"))  # one a program the name gave
        if out.returncode not in (0, 2) or not kept:
            raise SystemExit(f"porter compile failed (exit {out.returncode}):\n"
                             + out.stderr[-2000:])
        if len(kept) > 1:  # their computations share names (fused_computation.N)
            raise SystemExit(f"{program} is {len(kept)} programs here "
                             f"({', '.join(p.name for p in kept)}): libtpu's log cannot "
                             "say which one a computation's time belongs to; give "
                             "overrides that make it one (e.g. generate.frames=1)")
        where = computations(kept[0].read_text())
    spent = thread_seconds(out.stderr)
    if not spent:
        raise SystemExit("no per-operation lines in libtpu's log: this libtpu words its "
                         "backend log differently")
    backend = _BACKEND.search(out.stderr)
    if backend:
        scale = 1e-3 if backend[2] == "ms" else 1
        print(f"code generation (wall): {float(backend[1]) * scale:.1f} s")
    # the top-level program's own line waits on the operations' threads
    waiting = "(the top-level program, waiting on the operations)"
    by_computation = collections.Counter()
    for name, seconds in spent.items():
        by_computation[where.get(name, waiting)] += seconds
    print("thread seconds by computation:")
    for name, seconds in by_computation.most_common():
        print(f"  {seconds:7.2f}  {name}")
    print("slowest operations:")
    for name, seconds in [(n, s) for n, s in spent.most_common() if n in where][:25]:
        print(f"  {seconds:7.2f}  {name:45s} {where[name]}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
