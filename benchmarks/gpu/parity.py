"""A whole run on the GPU beside the same run on the CPU backend: text encoder,
transformer, VAE decode (every patch of the recipe, Wan's VAE scan among them), each
side in a fresh process through the Python API; their frames compared.

    python benchmarks/gpu/parity.py [RECIPE] [KEY=VALUE ...] [--json OUT.json]
        [--platform gpu] [--max-level 2]

Exit 1 when the frames differ by more than --max-level levels or in shape.

Run after benchmarks/gpu/run.sh, with the Python it installed Porter into
(/tmp/porter-gpu-venv/bin/python); run.sh runs it after the benchmark. The GPU's
matmuls and convolutions may round differently from the CPU's, so the frames are
compared as the tests compare two backends: the largest difference in levels of 255,
and the mean.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]

ONE_SIDE = """
import json, sys, time
import numpy as np
import porter
start = time.perf_counter()
port = porter.load(sys.argv[1], *sys.argv[3:])
loaded = time.perf_counter()
result = port.generate()
done = time.perf_counter()
import jax
np.save(sys.argv[2], result.frames)
print(json.dumps({"platform": jax.default_backend(), "device": str(jax.devices()[0]),
                  "load_s": round(loaded - start, 2), "generate_s": round(done - loaded, 2),
                  "compile_s": result.record["timings"]["compile"].get("seconds")}))
"""


def side(recipe: str, overrides: list[str], platform: str, folder: Path) -> dict:
    """One run in a fresh process on ``platform`` (runtime.platform: cpu, gpu, ...)."""
    frames = folder / f"{platform}.npy"
    args = [*overrides, f"runtime.platform={platform}", f"output.dir={folder / platform}"]
    done = subprocess.run([sys.executable, "-c", ONE_SIDE, recipe, str(frames), *args],
                          capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if done.returncode:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"parity: the {platform} run failed ({done.returncode})")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "frames": np.load(frames)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", nargs="?", default="recipes/wan-tiny.yaml")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--platform", default="gpu",
                        help="the accelerator side's runtime.platform (default gpu)")
    parser.add_argument("--max-level", type=int, default=2,
                        help="largest difference allowed, in levels of 255 (default 2)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        accelerated = side(args.recipe, args.overrides, args.platform, Path(tmp))
        cpu = side(args.recipe, args.overrides, "cpu", Path(tmp))
    a, b = accelerated.pop("frames").astype(int), cpu.pop("frames").astype(int)
    result = {"recipe": args.recipe, "overrides": args.overrides,
              "accelerator": accelerated, "cpu": cpu, "frames_shape": list(a.shape),
              "wall_s": round(time.perf_counter() - started, 1)}
    if a.shape == b.shape:
        diff = np.abs(a - b)
        result.update(max_level_difference=int(diff.max()),
                      mean_level_difference=round(float(diff.mean()), 4))
    else:
        result["cpu_frames_shape"] = list(b.shape)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    if result.get("max_level_difference", args.max_level + 1) > args.max_level:
        print(f"parity: the frames differ (shapes {list(a.shape)}, {list(b.shape)}; "
              f"allowed {args.max_level} levels)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
