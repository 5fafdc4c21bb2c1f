"""Every shipped real-size recipe compiled for the TPU its comment names, by the TPU
compiler (no TPU, no weights): weights and peak HBM per chip against the chip's,
compile time, FLOPs per step, the roofline bound and the published anchor; and the
Wan 14B transformer compiled unrolled beside compiled as a scan.

    python benchmarks/tpu_compile.py                 # every recipe (an hour or more)
    python benchmarks/tpu_compile.py wan14b.yaml     # some of them
    python benchmarks/tpu_compile.py --scan-vs-unrolled [--repeat N] [wan1.3b.yaml [KEY=VALUE ...]]
    python benchmarks/tpu_compile.py --table         # the README table from the results
    python benchmarks/tpu_compile.py wan14b.yaml --program vae.decode [--report FILE]
    python benchmarks/tpu_compile.py wan22-a14b.yaml --program vae.decode --same-as wan14b.yaml

Each recipe runs ``porter compile R --target T --json`` in a fresh process, and its
report is kept in results/tpu-compile.json as it arrives (a rerun skips recipes
already there unless named). ``--program`` compiles one program of a recipe already
there by itself (or takes it from ``porter compile ... --program P --json``'s output
in FILE) and puts its programs in place of that stage's (``report.replace_programs``):
a VAE made smaller by a patch, a decode now tiled, without compiling the whole recipe
again. ``--same-as`` takes the same program (the same inputs and weights per chip)
from another recipe's report instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from results_io import save

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "tpu-compile.json"

#: recipe -> the TPU its comment names (generic recipes: no configuration without the
#: checkpoint, see the table)
RECIPES = {
    "wan1.3b.yaml": "v6e-8", "wan14b.yaml": "v6e-8", "wan22-a14b.yaml": "v6e-8",
    "wan-i2v-14b.yaml": "v6e-8", "wan22-i2v-a14b.yaml": "v6e-8",
    "wan22-ti2v-5b.yaml": "v6e-8", "wan-flf2v-14b.yaml": "v6e-8",
    "wan1.3b-causvid.yaml": "v6e-8",
    "cogvideox-2b.yaml": "v6e-8", "cogvideox-5b.yaml": "v6e-8",
    "cogvideox1.5-5b.yaml": "v6e-8", "cogvideox-5b-i2v.yaml": "v6e-8",
    "hunyuan.yaml": "v6e-8", "hunyuan15.yaml": "v6e-8",
    "ltx-video.yaml": "v6e-1", "mochi.yaml": "v5p-8", "latte.yaml": "v6e-1",
    "allegro.yaml": "v5p-8",
}


def compile_one(name: str, target: str, *overrides: str) -> dict:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "porter.cli", "compile",
                          str(ROOT / "recipes" / name), "--target", target, "--json",
                          *overrides], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    row = {"recipe": name, "target": target, "overrides": list(overrides),
           "exit_code": out.returncode, "wall_s": round(time.perf_counter() - start, 1)}
    try:
        row["report"] = json.loads(out.stdout)
    except json.JSONDecodeError:
        row["error"] = _why(out)
    return row


def _why(out) -> str:
    """The failure in a few words: Porter's error line, or how the process died."""
    if out.returncode in (-9, 137):
        return "the compiling process was killed (out of host memory on this machine)"
    lines = out.stderr.strip().splitlines()
    errors = [line.removeprefix("error: ") for line in lines if line.startswith("error:")]
    return (errors or lines or ["?"])[-1]


def run(names: list[str]) -> None:
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    done = {r["recipe"] for r in results}
    for name in names or [n for n in RECIPES if n not in done]:
        print(f"{name} for {RECIPES[name]} ...", flush=True)
        row = compile_one(name, RECIPES[name])
        # read again: another run of this script may have saved rows meanwhile
        results = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
        results = [r for r in results if r["recipe"] != name] + [row]
        save(RESULTS, results)
        verdict = row.get("report", {}).get("verdict", {}).get("message", row.get("error"))
        print(f"  exit {row['exit_code']} in {row['wall_s']} s: {verdict}", flush=True)


def run_program(name: str, program: str, report_file: str | None = None,
                same_as: str | None = None) -> None:
    """``name``'s stored report with ``program`` compiled again by itself, or taken
    from ``same_as``'s report (see the module's doc). Where the recipe has no stored
    report (its whole compile failed), this program's report becomes it."""
    from porter.commands.compile import replace_programs

    stored = {r["recipe"]: r for r in json.loads(RESULTS.read_text())}
    report = None
    if same_as:
        rows = _program_rows(stored, same_as, program)
        if [(r["inputs"], r["weights_bytes_per_chip"]) for r in rows] != \
                [(r["inputs"], r["weights_bytes_per_chip"])
                 for r in _program_rows(stored, name, program)] or \
                stored[same_as]["target"] != stored[name]["target"]:
            raise SystemExit(f"{program} of {same_as} is not {name}'s: other inputs, "
                             "weights per chip or target")
        rows = [{**r, "replaced": f"the same program of {same_as}"} for r in rows]
    else:
        if report_file:
            report = json.loads(Path(report_file).read_text())
        else:
            compiled = compile_one(name, RECIPES[name], "--program", program)
            if "report" not in compiled:
                raise SystemExit(f"{name} {program}: {compiled['error']}")
            report = compiled["report"]
        rows = [{**r, "replaced": "compiled by itself"} for r in report["programs"]]
    entry = stored.get(name) or {"recipe": name, "target": RECIPES[name], "overrides": []}
    base = entry.get("report")
    if base is None:
        if report is None:
            raise SystemExit(f"{name} has no report in {RESULTS.name} to take {program} into")
        replaced = {**report, "programs": rows}
    else:
        if report is not None and report["weights_per_chip"] != base["weights_per_chip"]:
            raise SystemExit(f"{program}: compiled with other weights per chip than "
                             f"{name}'s stored report (another recipe?)")
        replaced = replace_programs(base, rows)
    # a failed whole compile's error, exit code and time do not describe this report
    failed_run = {"error", "exit_code", "wall_s"} if base is None else set()
    stored[name] = {k: v for k, v in entry.items() if k not in failed_run} | {"report": replaced}
    save(RESULTS, list(stored.values()))
    print(f"{name}: {program} ({len(rows)} program(s)) replaced; "
          f"{replaced['verdict']['message']}")


def _program_rows(stored: dict, name: str, program: str) -> list[dict]:
    if "report" not in stored.get(name, {}):
        raise SystemExit(f"{name} has no report in {RESULTS.name}: compile it whole first")
    rows = [r for r in stored[name]["report"]["programs"] if r["program"] == program]
    if not rows:
        raise SystemExit(f"{name}'s report has no program {program}")
    return rows


def scan_vs_unrolled(name: str, *overrides: str, repeat: int = 1) -> None:
    """A recipe's transformer compiled for v6e-8 as a scan and unrolled, side by side,
    ``repeat`` times in turn (this machine's compile times vary by about 10% from run to
    run; the row keeps every run and their median): wall time and the compiling
    process's peak memory (an unrolled 40-block Wan 14B at 720p needs more than this
    24 GiB machine had before the edge pads)."""
    path = RESULTS.with_name("tpu-scan-vs-unrolled.json")
    runs = {True: [], False: []}
    for _ in range(repeat):
        for scan in (True, False):
            runs[scan].append(_compile_transformer(name, scan, overrides))
            print(runs[scan][-1], flush=True)
    for scan, measured in runs.items():
        row = {"recipe": name, "overrides": list(overrides), "scan": scan,
               **_median_run(measured), "runs": measured}
        rows = json.loads(path.read_text()) if path.exists() else []
        rows = [r for r in rows if (r["recipe"], r.get("overrides", []), r["scan"])
                != (name, list(overrides), scan)] + [row]
        save(path, rows)


def _compile_transformer(name: str, scan: bool, overrides) -> dict:
    """One fresh process compiling ``name``'s transformer.forward for v6e-8."""
    start = time.perf_counter()
    out = subprocess.run(
        ["/usr/bin/time", "-f", "%M", sys.executable, "-m", "porter.cli", "compile",
         str(ROOT / "recipes" / name), "--target", "v6e-8", "--program",
         "transformer.forward", "--json", f"compile.transformer.scan={str(scan).lower()}",
         *overrides],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    run = {"exit_code": out.returncode, "wall_s": round(time.perf_counter() - start, 1),
           "peak_rss_gib": round(int(out.stderr.strip().splitlines()[-1]) / 2**20, 1)}
    if out.returncode == 0:
        program = json.loads(out.stdout)["programs"][0]
        run.update(trace_s=program["trace_s"], compile_s=program["compile_s"],
                   tflops_per_chip=round(program["flops"] / 1e12, 1),
                   memory=program["memory"])
    return run


def _median_run(runs: list[dict]) -> dict:
    """The run with the median compile time (a failed run counts as the slowest)."""
    ordered = sorted(runs, key=lambda r: r.get("compile_s", float("inf")))
    return ordered[(len(ordered) - 1) // 2]


def gib(n) -> str:
    return f"{n / 2**30:.1f}" if n is not None else "-"


def whole_video(name: str, report: dict) -> str:
    """A whole video's lower bound, in seconds: the report's own (``video``), or, for a
    report from before ``porter compile`` gave one, the same sum from its rows (each
    encode and decode program at the largest of its FLOPs at the bfloat16 peak, its
    bytes at HBM's bandwidth and its collectives' at the interconnect's, times its
    calls; the recipe's steps at the step bound: ``porter.aot.roofline.video``), naming
    a stage with a program that was not compiled or none (an eager text encoder)."""
    from porter import recipe as recipe_mod
    from porter.aot import roofline
    from porter.runtime import chips

    whole = report.get("video")
    if whole is None and report["roofline"]:
        chip = chips.by_kind(report["target"]["chip"])
        rows = [dict(row, call_bound_s=None if row.get("flops") is None else max(
            roofline.compute_seconds(row["flops"], row.get("matmul_flops", {}), chip),
            row["bytes_accessed"] / chip.hbm_bytes_per_s,
            sum(c["bytes_sent_per_chip"] for c in row.get("collectives", {}).values())
            / chip.ici_bytes_per_s)) for row in report["programs"]]
        steps = recipe_mod.load(ROOT / "recipes" / name).generate.steps
        whole = roofline.video(rows, steps, report["roofline"])
    if whole is None:
        return "-"
    left_out = f" (without {', '.join(whole['missing'])})" if whole["missing"] else ""
    return f"{whole['bound_s']:.2f}{left_out}"


def table() -> str:
    results = {r["recipe"]: r for r in json.loads(RESULTS.read_text())}
    lines = ["| recipe | target | weights / chip (GiB) | peak / chip (GiB) | HBM (GiB) | fits "
             "| compile (s) | TFLOP / step / chip | bound (s/step) | whole video, bound (s) "
             "| published (s/step, MFU) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in RECIPES:
        row = results.get(name)
        if row is None:
            continue
        report = row.get("report")
        if report is None:
            lines.append(f"| `{name}` | {row['target']} | | | | no: {row.get('error')} "
                         "| | | | | |")
            continue
        verdict, bound = report["verdict"], report["roofline"]
        peaks = [p.get("peak_bytes_per_chip") for p in report["programs"]]
        peak = max((p for p in peaks if p), default=None)
        fits = {True: "yes", False: f"**no**: {verdict.get('program')}",
                None: verdict["message"]}[verdict["fits"]]
        left_out = sorted(component for component, why in report["not_compiled"].items()
                          if why.startswith("not asked for"))
        if left_out:
            fits += f" (not compiled: {', '.join(left_out)})"
        anchor = "; ".join(f"{a['seconds_per_step']} ({a['mfu']:.0%})"
                           for a in report["anchors"]) or ""
        lines.append(
            f"| `{name}` | {row['target']} | {gib(report['weights_per_chip']['total'])} | "
            f"{gib(peak)} | {gib(report['target']['usable_hbm_bytes'])} | {fits} | "
            f"{report['compile_s']:.0f} | "
            f"{bound['flops_per_chip'] / 1e12:.0f} | {bound['bound_s']:.2f} "
            f"({bound['limited_by']}) | {whole_video(name, report)} | {anchor} |" if bound else
            f"| `{name}` | {row['target']} | {gib(report['weights_per_chip']['total'])} | "
            f"{gib(peak)} | {gib(report['target']['usable_hbm_bytes'])} | {fits} | "
            f"{report['compile_s']:.0f} | | | | |")
    return "\n".join(lines)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args == ["--table"]:
        print(table())
    elif "--program" in args:
        def option(flag):
            return args[args.index(flag) + 1] if flag in args else None
        run_program(args[0], option("--program"), option("--report"), option("--same-as"))
    elif args[:1] == ["--scan-vs-unrolled"]:
        repeat = int(args.pop(args.index("--repeat") + 1)) if "--repeat" in args else 1
        args = [a for a in args if a != "--repeat"]
        scan_vs_unrolled(*(args[1:] or ["wan14b.yaml"]), repeat=repeat)
    else:
        run(args)
