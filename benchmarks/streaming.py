"""Frames as they are made, at real width on this machine: a port's VAE decode of the
same random latents whole (``family.decode``: one compiled call) and streamed
(``family.decode_chunks``, each chunk encoded into a fragmented MP4 as it comes, as a
run writes stream.mp4), each twice (the first compiles). For the stream: seconds from
the decode's start to the first chunk on the host, to the first frame a player can
show from the file, and to its last; frames delivered a second; the programs each
path compiled; and whether the streamed frames equal the whole decode's.

    python benchmarks/streaming.py [--family wan] [--height 128] [--width 256]
        [--frames 33] [--checkpoint DIR]

The checkpoint is the family's published layout with random weights
(tests/models/real_size.py), written to a temporary folder unless given.
Results: benchmarks/results/streaming-cpu.json.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from results_io import save

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
RECIPES = {"wan": ("wan1.3b.yaml", []),
           "cogvideox": ("cogvideox-2b.yaml", ["model.dtype=float32"])}


def latents_shape(family: str, height: int, width: int, frames: int) -> tuple:
    count = (frames - 1) // 4 + 1
    return (1, 16, count, height // 8, width // 8) if family == "wan" \
        else (1, count, 16, height // 8, width // 8)


def programs_counter():
    import jax

    count = {"programs": 0}

    def seen(event, duration, **_):
        if event.endswith("jaxpr_to_mlir_module_duration"):
            count["programs"] += 1
    jax.monitoring.register_event_duration_secs_listener(seen)
    return count


def streamed(port, latents, path: Path, fps: int) -> dict:
    """One streamed decode into ``path``: when each thing happened, from its start."""
    from porter.rundir.video import Stream

    made, found = [], {}
    start = time.perf_counter()
    with Stream(path, fps) as stream:
        for chunk in port.family.decode_chunks(port.pipe, latents, port.recipe):
            made.append(chunk)
            found.setdefault("first_chunk_s", time.perf_counter() - start)
            stream.add(chunk)
            if stream.playable:
                found.setdefault("first_playable_s", time.perf_counter() - start)
    found["done_s"] = time.perf_counter() - start
    found.setdefault("first_playable_s", found["done_s"])
    found["chunks"] = len(made)
    return {key: round(v, 3) if isinstance(v, float) else v for key, v in found.items()}, \
        np.concatenate(made)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(RECIPES), default="wan")
    parser.add_argument("--height", type=int, default=128)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--frames", type=int, default=33)
    parser.add_argument("--checkpoint", type=Path)
    args = parser.parse_args()
    import torch

    work = Path(tempfile.mkdtemp(prefix="streaming-"))
    checkpoint = args.checkpoint
    if checkpoint is None:
        checkpoint = work / args.family
        subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from "
                        "models.real_size import write_checkpoint; write_checkpoint("
                        f"{args.family!r}, Path(sys.argv[1]))", str(checkpoint)],
                       check=True, env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"})
    import porter

    recipe, extra = RECIPES[args.family]
    port = porter.load(ROOT / "recipes" / recipe, f"model.source={checkpoint}",
                       "mesh.dp=1", "mesh.tp=1", f"generate.height={args.height}",
                       f"generate.width={args.width}", f"generate.frames={args.frames}",
                       *extra, cpu_devices=1)
    latents = torch.randn(*latents_shape(args.family, args.height, args.width, args.frames),
                          generator=torch.Generator().manual_seed(1))
    counter = programs_counter()
    row = {"family": args.family, "size": f"{args.width}x{args.height}",
           "frames": args.frames, "machine": "2-core CPU, one device"}
    with port.active(), port.runtime.env:
        for label in ("whole", "stream"):
            counter["programs"], seconds = 0, []
            for attempt in range(2):
                start = time.perf_counter()
                if label == "whole":
                    whole = port.family.decode(port.pipe, latents, port.recipe)
                else:
                    timing, frames = streamed(port, latents, work / f"{attempt}.mp4",
                                              port.recipe.output.fps)
                    row[f"stream_{('cold', 'warm')[attempt]}"] = timing
                seconds.append(round(time.perf_counter() - start, 3))
            row[f"{label}_s"] = {"cold": seconds[0], "warm": seconds[1]}
            row[f"{label}_programs"] = counter["programs"]
    row["frames_equal"] = bool(np.array_equal(frames, whole))
    row["max_frame_levels"] = int(np.abs(frames.astype(int) - whole).max())
    warm = row["stream_warm"]
    row["frames_per_second_delivered"] = round(len(frames) / warm["done_s"], 2)
    print(json.dumps(row, indent=1), flush=True)
    path = ROOT / "benchmarks" / "results" / "streaming-cpu.json"
    kept = [r for r in (json.loads(path.read_text()) if path.exists() else [])
            if (r["family"], r["size"], r["frames"]) != (args.family, row["size"],
                                                         args.frames)]
    save(path, kept + [row])


if __name__ == "__main__":
    main()
