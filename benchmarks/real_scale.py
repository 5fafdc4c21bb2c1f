"""Real-scale loading and one step: Wan 2.1 1.3B at its published size (random
weights, saved by save_pretrained into sharded files), on 1 and 8 devices.

    python benchmarks/real_scale.py [--checkpoint DIR] [--devices 1 8] [--json OUT]
        [--source-tree TREE]

Each run is a fresh `porter run recipes/wan1.3b.yaml` process at a low resolution
(64x96, 5 frames, 2 steps); the numbers come from its run record and from
`porter plan --devices N --json`. ``--source-tree`` runs another checkout of
Porter (e.g. an older commit, for a before/after table); a run the kernel (or
the watchdog, at ``--limit-gib``) kills is reported as such with the peak seen.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "wan1.3b.yaml"
LOW = ["generate.height=64", "generate.width=96", "generate.frames=5", "generate.steps=2"]
GiB = 2**30


def environment(tree: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if tree is not None:  # that checkout's porter and plugins first on the path
        paths = [tree, *sorted((tree / "plugins").glob("*"))]
        env["PYTHONPATH"] = os.pathsep.join(map(str, paths))
    return env


def rss_of_tree(pid: int) -> int:
    """Resident bytes of a process and its children."""
    total = 0
    for child in [pid, *children(pid)]:
        try:
            for line in Path(f"/proc/{child}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def children(pid: int) -> list[int]:
    try:
        found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(c) for c in found]


def run(args: list[str], env: dict, limit: int) -> dict:
    """Run a command, watching its memory; kill it past ``limit`` bytes."""
    process = subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    peak, killed = 0, False

    def watch():
        nonlocal peak, killed
        while process.poll() is None:
            peak = max(peak, rss_of_tree(process.pid))
            if peak > limit:
                killed = True
                process.kill()
            time.sleep(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    out, err = process.communicate()
    watcher.join()
    return {"returncode": process.returncode, "stdout": out, "stderr": err,
            "watched_peak_bytes": peak, "killed_by_watchdog": killed}


def plan(devices: int, overrides: list[str], env: dict) -> dict:
    out = subprocess.run([sys.executable, "-m", "porter.cli", "plan", str(RECIPE), *overrides,
                          "--devices", str(devices), "--json"], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


def measure(checkpoint: Path, devices: int, tree: Path | None, limit: int) -> dict:
    env = environment(tree)
    overrides = [f"model.source={checkpoint}", *LOW]
    if devices == 1:
        overrides += ["mesh.dp=1", "mesh.tp=1", "generate.cfg_parallel=false"]
    planned = plan(devices, overrides, environment(None))
    with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as cache:
        env["PORTER_CACHE_DIR"] = cache  # a cold compile, as on a new machine
        result = run([sys.executable, "-m", "porter.cli", "run", str(RECIPE), *overrides,
                      f"output.dir={out}", "--cpu-devices", str(devices), "--no-progress"],
                     env, limit)
        record_file = Path(out) / "run.json"
        record = json.loads(record_file.read_text()) if record_file.exists() else None
    row = {"devices": devices, "mesh": planned["mesh"],
           "weights_bytes": sum(c["bytes"] for c in planned["components"]),
           "plan_bytes_per_device": planned["weights_bytes_per_device"],
           "plan_bytes_all_devices": planned["weights_bytes_per_device"] * planned["devices"],
           "watched_peak_bytes": result["watched_peak_bytes"],
           "killed_by_watchdog": result["killed_by_watchdog"],
           "returncode": result["returncode"]}
    if record is None:
        row["error"] = result["stderr"].strip().splitlines()[-1:] or ["killed"]
        return row
    timings, weights = record["timings"], record.get("weights", {})
    components = weights.get("components", {})
    row.update({
        "load_s": timings["load_s"], "to_jax_s": timings["to_jax_s"],
        "placed_bytes_per_s": row["weights_bytes"] / timings["to_jax_s"],
        "measured_bytes_per_device": sum(c["bytes_per_device"] for c in components.values())
        if components else None,
        "peak_rss_bytes": record.get("memory", {}).get("host_peak_rss_bytes",
                                                        result["watched_peak_bytes"]),
        "compile_s": timings["compile"]["seconds"], "step_s": timings.get("step_s"),
        "decode_s": timings.get("decode_s")})
    return row


def render(rows: list[dict]) -> str:
    lines = ["| devices | load | to JAX | rate | peak RSS | bound | plan / measured per device "
             "| compile | step |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['devices']} | killed at {r['watched_peak_bytes'] / GiB:.1f} GiB "
                         f"| | | | | | | |")
            continue
        bound = (1.15 if r["devices"] > 1 else 1.3) * r["plan_bytes_all_devices"] + 1.5 * GiB
        measured = r["measured_bytes_per_device"]
        lines.append(
            f"| {r['devices']} | {r['load_s']:.1f} s | {r['to_jax_s']:.1f} s | "
            f"{r['placed_bytes_per_s'] / 1e9:.2f} GB/s | {r['peak_rss_bytes'] / GiB:.2f} GiB | "
            f"{bound / GiB:.2f} GiB | {r['plan_bytes_per_device'] / GiB:.3f} / "
            + (f"{measured / GiB:.3f} GiB" if measured is not None else "n/a")
            + f" | {r['compile_s']:.1f} s | {r['step_s']:.2f} s |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, help="a saved real-size Wan 1.3B "
                        "(default: write one to a temporary directory)")
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--source-tree", type=Path, help="run this checkout's Porter")
    parser.add_argument("--limit-gib", type=float, default=21.0,
                        help="kill a run past this resident size (default 21)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = args.checkpoint
        if checkpoint is None:
            checkpoint = Path(scratch) / "wan1.3b"
            # in its own process: the 3.4 GB it builds are gone before any run starts
            subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                            "from models.real_size import write_checkpoint; "
                            "write_checkpoint('wan', Path(sys.argv[1]))", str(checkpoint)],
                           env={**environment(None), "PYTHONPATH": str(ROOT / "tests")},
                           check=True)
        rows = [measure(checkpoint, n, args.source_tree, int(args.limit_gib * GiB))
                for n in args.devices]
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    print(render(rows))


if __name__ == "__main__":
    main()
