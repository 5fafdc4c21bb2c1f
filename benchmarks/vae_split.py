"""A real-width VAE decode over CPU devices: one device, 8 virtual devices with the
feature maps split over width (the rule ``porter.transforms.sharding.vae_split`` gives
an accelerator mesh), 8 devices with the VAE kept whole (``activations: {vae:
[]}``: it runs on one of them), and one device with the VAE in bfloat16. Each in a
fresh process (tests/models/decode_latents.py) decoding the same random latents
through a port of the recipe: the first decode (compiling) and a second, the
process's peak memory, and the largest (and mean) difference from the one-device
float32 decode.

    python benchmarks/vae_split.py [--family wan] [--height 128] [--width 256]
        [--frames 9] [--checkpoint DIR]

The checkpoint is the family's published layout with random weights
(tests/models/real_size.py), written to a temporary folder unless given.
Results: benchmarks/results/vae-split-cpu.json.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from results_io import save

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
RECIPES = {"wan": ("wan1.3b.yaml", []), "cogvideox": ("cogvideox-2b.yaml",
                                                       ["model.dtype=float32"])}
sys.path.insert(0, str(TESTS))
from support import vae_split_rule  # noqa: E402 - the tests' folder, above

CASES = {"one device": (1, ["mesh.dp=1", "mesh.tp=1"]),
         "8 devices, split over width": (8, [vae_split_rule()]),
         "8 devices, VAE whole (on one)": (8, ["sharding.activations.vae=[]"]),
         # the float32 VAE's frames against the bfloat16 one's (the recipes keep float32)
         "one device, VAE in bfloat16": (1, ["mesh.dp=1", "mesh.tp=1",
                                             "dtypes.components.vae=bfloat16"])}


def python(*args):
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                         env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"})
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])


def written_checkpoint(family: str, directory: Path) -> Path:
    """The family's published layout with random weights, written to ``directory``
    (tests/models/real_size.py, in a process of its own)."""
    python("-c", "import sys; from pathlib import Path; from models.real_size import "
           f"write_checkpoint; write_checkpoint({family!r}, Path(sys.argv[1]))",
           str(directory))
    return directory


def latents_shape(family: str, height: int, width: int, frames: int) -> tuple:
    count = (frames - 1) // 4 + 1
    return (1, 16, count, height // 8, width // 8) if family == "wan" \
        else (1, count, 16, height // 8, width // 8)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(RECIPES), default="wan")
    parser.add_argument("--height", type=int, default=128)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--frames", type=int, default=9)
    parser.add_argument("--checkpoint", type=Path)
    args = parser.parse_args()
    import torch
    from safetensors.torch import save_file

    work = Path(tempfile.mkdtemp(prefix="vae-split-"))
    checkpoint = args.checkpoint or written_checkpoint(args.family, work / args.family)
    latents = work / "latents.safetensors"
    shape = latents_shape(args.family, args.height, args.width, args.frames)
    save_file({"latents": torch.randn(*shape, generator=torch.Generator().manual_seed(1))},
              latents)
    recipe, extra = RECIPES[args.family]
    common = [f"model.source={checkpoint}", f"generate.height={args.height}",
              f"generate.width={args.width}", f"generate.frames={args.frames}", *extra]
    path = ROOT / "benchmarks" / "results" / "vae-split-cpu.json"
    kept = [row for row in (json.loads(path.read_text()) if path.exists() else [])
            if row["family"] != args.family]  # the other families' rows stay
    results, one = [], None
    for case, (devices, overrides) in CASES.items():
        out = work / f"{len(results)}.npz"
        python(str(TESTS / "models" / "decode_latents.py"), "--warm",
               str(ROOT / "recipes" / recipe), str(latents), str(out), str(devices),
               *common, *overrides)
        found = np.load(out)
        one = found if one is None else one
        levels = np.abs(found["frames"].astype(int) - one["frames"])
        row = {"family": args.family, "case": case, "devices": devices,
               "size": f"{args.width}x{args.height}", "frames": args.frames,
               "cold_s": round(float(found["cold_s"]), 2),
               "warm_s": round(float(found["warm_s"]), 2),
               "peak_rss_gib": round(float(found["peak_rss_bytes"]) / 2**30, 2),
               "max_diff": float(np.abs(found["video"] - one["video"]).max()
                                 / np.abs(one["video"]).max()),
               "max_frame_levels": int(levels.max()),
               "mean_frame_levels": float(levels.mean())}
        print(row, flush=True)
        results.append(row)
        save(path, kept + results)


if __name__ == "__main__":
    main()
