"""Step time against token count, Porter vs PyTorch eager, on this machine.

    python benchmarks/sweep.py                       # runs porter bench at each size
    python benchmarks/sweep.py --plot-only           # redraw from the saved results

Runs `porter bench` on the Wan-shaped 2-block bench recipe at several frame
counts (each in its own process, so memory and caches do not carry over),
saves every result to benchmarks/results/cpu-sweep.json as it arrives (an
interrupted sweep keeps what it measured), and draws
benchmarks/cpu-step-time.png (needs matplotlib: `pip install matplotlib`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import results_io  # benchmarks/, beside this script

HERE = Path(__file__).resolve().parent
RECIPE = HERE.parent / "recipes" / "bench" / "wan-block-2k.yaml"
RESULTS = HERE / "results" / "cpu-sweep.json"
PLOT = HERE / "cpu-step-time.png"
FRAMES = (5, 9, 17, 33, 65)  # 416x256: 832, 1248, 2080, 3744, 7072 video tokens


def measure(frames: int, steps: int) -> dict:
    command = [sys.executable, "-m", "porter.cli", "bench", str(RECIPE),
               f"generate.frames={frames}", "--steps", str(steps), "--json"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"porter bench failed at {frames} frames:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def save(results: list[dict]) -> None:
    results_io.save(RESULTS, results)


def plot(results: list[dict]) -> None:
    plt = results_io.pyplot()
    results = sorted(results, key=lambda r: r["tokens"])
    tokens = [r["tokens"] for r in results]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(tokens, [r["step_s"]["porter"] for r in results], "o-", label="Porter (JAX)")
    ax.plot(tokens, [r["step_s"]["pytorch_eager"] for r in results], "s--",
            label="PyTorch eager")
    for r in results:
        ax.annotate(f"{r['step_s']['ratio']:.2f}x", (r["tokens"], r["step_s"]["porter"]),
                    textcoords="offset points", xytext=(0, 8), ha="center", fontsize=8)
    ax.set_xlabel("video tokens")
    ax.set_ylabel("seconds per step")
    ax.set_title("Wan-shaped transformer, 2 blocks, float32, CPU")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(PLOT, dpi=120)
    print(f"wrote {PLOT}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per size")
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args()
    if not args.plot_only:
        results = []
        for frames in FRAMES:
            result = measure(frames, args.steps)
            results.append(result)
            save(results)
            step = result["step_s"]
            print(f"{result['tokens']:>6} tokens: porter {step['porter']:.2f} s, "
                  f"PyTorch {step['pytorch_eager']:.2f} s, {step['ratio']:.2f}x", flush=True)
    plot(json.loads(RESULTS.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
