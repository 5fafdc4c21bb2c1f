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
import tempfile
import time
from pathlib import Path

import numpy as np

from results_io import save
from vae_split import RECIPES, latents_shape, written_checkpoint

ROOT = Path(__file__).resolve().parent.parent

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
    parser.add_argument("--paths", default="whole,stream",
                        help="which decodes to time (whole, stream, or both)")
    args = parser.parse_args()
    import torch

    work = Path(tempfile.mkdtemp(prefix="streaming-"))
    checkpoint = args.checkpoint or written_checkpoint(args.family, work / args.family)
    import porter
    from porter.runtime.monitor import compile_monitor

    recipe, extra = RECIPES[args.family]
    port = porter.load(ROOT / "recipes" / recipe, f"model.source={checkpoint}",
                       "mesh.dp=1", "mesh.tp=1", f"generate.height={args.height}",
                       f"generate.width={args.width}", f"generate.frames={args.frames}",
                       *extra, cpu_devices=1)
    latents = torch.randn(*latents_shape(args.family, args.height, args.width, args.frames),
                          generator=torch.Generator().manual_seed(1))
    monitor = compile_monitor()
    row = {"family": args.family, "size": f"{args.width}x{args.height}",
           "frames": args.frames, "machine": "2-core CPU, one device"}
    with port.active(), port.runtime.env:
        for label in args.paths.split(","):
            before, seconds = monitor.programs, []
            for attempt in range(2):
                start = time.perf_counter()
                if label == "whole":
                    whole = port.family.decode(port.pipe, latents, port.recipe)
                else:
                    timing, frames = streamed(port, latents, work / f"{attempt}.mp4",
                                              port.recipe.output.fps)
                    row[f"stream_{('cold', 'warm')[attempt]}"] = timing
                seconds.append(round(time.perf_counter() - start, 3))
                print(f"{label} decode {attempt + 1}: {seconds[-1]} s", flush=True)
            row[f"{label}_s"] = {"cold": seconds[0], "warm": seconds[1]}
            row[f"{label}_programs"] = monitor.programs - before
    if "whole_s" in row and "stream_s" in row:
        row["frames_equal"] = bool(np.array_equal(frames, whole))
        row["max_frame_levels"] = int(np.abs(frames.astype(int) - whole).max())
    if "stream_warm" in row:
        row["frames_per_second_delivered"] = round(len(frames) / row["stream_warm"]["done_s"],
                                                   2)
    print(json.dumps(row, indent=1), flush=True)
    path = ROOT / "benchmarks" / "results" / "streaming-cpu.json"
    kept = [r for r in (json.loads(path.read_text()) if path.exists() else [])
            if (r["family"], r["size"], r["frames"]) != (args.family, row["size"],
                                                         args.frames)]
    save(path, kept + [row])


if __name__ == "__main__":
    main()
