"""The whole 4-step video of Wan 2.1 T2V 1.3B on one GPU, beside its peers.

`recipes/wan1.3b-causvid.yaml` (480x832, 81 frames, 4 UniPC steps, one transformer pass
a step) on one device, each side in a fresh process on the same model folder:

- porter: the recipe as shipped (bfloat16, the VAE in float32, cuDNN attention);
- porter-fast: fp8 matmuls and fp8 self-attention, whole-frame attention windows
  (the GPU section's W1 in benchmarks/README.md) and the VAE in bfloat16;
- diffusers: its own pipeline, eager, in the recipe's dtypes;
- diffusers-compile: the same with its transformer under ``torch.compile``;
- the specialised GPU systems (FastVideo, sglang's diffusion runtime), tried from the
  wheels in --peers: pip's answer (what will not install, and why) recorded;
- with --only, the decode alone: `porter-decode`, `diffusers-decode` (and their
  `-bf16` forms, the VAE in bfloat16), the same random latents decoded three times in a
  row, their frames compared in levels of 255.

Each Porter side reports its start-up (process start to ``import porter`` done), load,
a cold video (compiling) and a warm one by stage (text encoding, steps, decode); each
diffusers side its load, first and warm video. The model folder is Wan 2.1 T2V 1.3B's
published layout with random weights (tests/models/real_size.py: the transformer, the
UMT5-XXL text encoder and the VAE as published), drawn on the GPU and written once.
The recipe's CausVid LoRA is left out (``lora=[]``): Porter fuses a LoRA into the
weights when it loads them, so a step costs the same with it.

    python benchmarks/gpu/whole_video.py --out DIR [--checkpoint DIR] [--deadline S]
        [--peers DIR] [--only SIDE ...] [--rehearse]

Results go to DIR/whole-video.json as each side ends (a side cut off by the deadline
is recorded as such; the others keep their figures). --rehearse runs the same on a CPU
at a small size (one transformer block, one text layer, a narrow VAE, 96x64, 5 frames)
to check the script before a GPU is lent. `VIDEO=1 bash benchmarks/gpu/run.sh` installs
Porter on a bare GPU machine and runs this (VIDEO_ARGS: its arguments).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
from results_io import save  # noqa: E402 - benchmarks/, above

RECIPE = REPO / "recipes" / "wan1.3b-causvid.yaml"
# one device; no LoRA file here (fused at load: the same step either way)
COMMON = ["lora=[]", "mesh.tp=1", "mesh.dp=1"]
WINDOW = ["attention.window.tile=[1,30,52]", "attention.window.reach=[2,0,0]",
          "attention.window.global_frames=1"]
FAST = ["quantize.format=fp8", "attention.backend=cudnn-fp8", "attention.cross_backend=cudnn",
        *WINDOW, "dtypes.components.vae=bfloat16"]
BF16_VAE = ["dtypes.components.vae=bfloat16"]
SIDES = {"porter": ("porter", []), "porter-fast": ("porter", FAST),
         "diffusers": ("diffusers", []), "diffusers-compile": ("diffusers-compile", []),
         # the decode alone, of the same random latents (three in a row: the first
         # compiles or autotunes), the VAE in float32 as the recipe keeps it and in bfloat16
         "porter-decode": ("porter-decode", []), "porter-decode-bf16": ("porter-decode", BF16_VAE),
         "diffusers-decode": ("diffusers-decode", []),
         "diffusers-decode-bf16": ("diffusers-decode", BF16_VAE)}
WHOLE = ("porter", "porter-fast", "diffusers", "diffusers-compile")
# the rehearsal: the same sides at a size a CPU runs in minutes (the VAE's latent
# channels and scale as published, its maps a sixth as wide: its decode was most of
# the rehearsal)
REHEARSE_LAYERS = {"transformer": {"num_layers": 1},
                   "text_encoder": {"num_layers": 1, "vocab_size": 384},
                   "vae": {"base_dim": 16}}
REHEARSE = ["generate.height=64", "generate.width=96", "generate.frames=5",
            "runtime.platform=cpu"]
REHEARSE_FAST = ["attention.window.tile=[1,1,2]", "attention.window.reach=[0,1,1]",
                 "attention.window.global_frames=0", "dtypes.components.vae=bfloat16"]
PEERS = {"fastvideo": "fastvideo", "sglang": "sglang[diffusion]"}

ONE_SIDE = r"""
import json, sys, time
spawned = float(sys.argv[1])
import porter
from porter import recipe as recipe_mod, registry as registry_mod
from porter.commands.bench import video
from porter.port import checks
imported = time.time() - spawned
kind, out = sys.argv[2], sys.argv[3]


def latents(recipe, torch):  # the same random latents on every side, Wan's layout
    g = recipe.generate
    shape = (1, 16, (g.frames - 1) // 4 + 1, g.height // 8, g.width // 8)
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))

recipe = recipe_mod.load(sys.argv[4], sys.argv[5:])
if kind == "porter":
    from porter.runtime import memory
    result = video.porter_video(recipe)
    result["memory"] = memory.peak_memory(result["platform"])
elif kind.startswith("diffusers") and not kind.endswith("decode"):
    import torch
    family = checks.checked_family(recipe, registry_mod.loaded())
    platform = "gpu" if torch.cuda.is_available() else "cpu"
    result = video.diffusers_video(recipe, family, platform, compiled=kind.endswith("compile"))
    if torch.cuda.is_available():
        result["device_peak_bytes"] = torch.cuda.max_memory_allocated()
elif kind == "porter-decode":
    import numpy
    import torch
    start = time.perf_counter()
    port = porter.load(recipe)
    loaded = time.perf_counter() - start
    result = {"load_s": round(loaded, 3), "decode_s": []}
    with port.active() as env, env:
        for _ in range(3):
            start = time.perf_counter()
            # as a run decodes: chunk by chunk (the stream's), the first chunk's time kept
            chunks = []
            for chunk in port.family.decode_chunks(port.pipe, latents(recipe, torch),
                                                   port.recipe):
                if not chunks:
                    result.setdefault("first_chunk_s", []).append(
                        round(time.perf_counter() - start, 3))
                chunks.append(chunk)
            frames = numpy.concatenate(chunks)
            result["decode_s"].append(round(time.perf_counter() - start, 3))
    result["frames"] = list(frames.shape)
    from porter.runtime import memory
    result["memory"] = memory.peak_memory(port.runtime.platform)
elif kind == "diffusers-decode":
    import torch
    from porter import loading
    family = checks.checked_family(recipe, registry_mod.loaded())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    start = time.perf_counter()
    pipe = loading.load_pipeline(family, recipe).to(device)
    result = {"load_s": round(time.perf_counter() - start, 3), "decode_s": []}
    vae = pipe.vae
    # what WanPipeline does after its last step
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1).to(device, vae.dtype)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1).to(device, vae.dtype)
    with torch.inference_mode():
        for _ in range(3):
            start = time.perf_counter()
            z = latents(recipe, torch).to(device, vae.dtype) / inv_std + mean
            video = vae.decode(z, return_dict=False)[0]
            frames = pipe.video_processor.postprocess_video(video.float(), output_type="np")[0]
            frames = (frames * 255).round().clip(0, 255).astype("uint8")
            result["decode_s"].append(round(time.perf_counter() - start, 3))
    result["frames"] = list(frames.shape)
    if device == "cuda":
        result["device_peak_bytes"] = torch.cuda.max_memory_allocated()
if kind.endswith("decode"):  # beside the process's record: the other side's to compare
    import numpy as np
    np.save(out.replace(".json", ".npy"), frames)
result["startup_s"] = round(imported, 3)
json.dump(result, open(out, "w"))
"""


def write_checkpoint(directory: Path, rehearse: bool, text_encoder: bool = True) -> dict:
    """Wan 2.1 T2V 1.3B's published layout with random weights, drawn where they are
    fastest to draw (the GPU) and saved as diffusers saves them."""
    sys.path.insert(0, str(REPO / "tests"))
    import torch
    from models.real_size import weight_bytes, write_checkpoint as write

    start = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    write("wan", directory, max_shard_size="5GB", published_text_encoder=text_encoder,
          fewer=REHEARSE_LAYERS if rehearse else None, device=device)
    torch.cuda.empty_cache()  # the sides' processes need the GPU's memory, not this one
    return {"path": str(directory), "weight_bytes": weight_bytes(directory),
            "text_encoder": "published" if text_encoder else "one-layer stand-in",
            "written_s": round(time.perf_counter() - start, 1), "drawn_on": device}


def run_side(name: str, checkpoint: Path, rehearse: bool, folder: Path,
             seconds: float) -> dict:
    """One side in a fresh process, within ``seconds``."""
    kind, overrides = SIDES[name]
    if rehearse:
        overrides = [*REHEARSE, *(REHEARSE_FAST if overrides == FAST else overrides)]
    args = [*COMMON, f"model.source={checkpoint}", *overrides]
    out = folder / f"{name}.json"
    start = time.perf_counter()
    try:
        # -P: the installed Porter, not the source tree
        done = subprocess.run([sys.executable, "-P", "-c", ONE_SIDE, repr(time.time()), kind,
                               str(out), str(RECIPE), *args],
                              capture_output=True, text=True, cwd=REPO, timeout=seconds)
    except subprocess.TimeoutExpired as stopped:
        tail = (stopped.stderr or b"")[-3000:]
        return {"side": name, "overrides": args, "error": f"cut off after {seconds:.0f} s",
                "log_tail": tail.decode(errors="replace") if isinstance(tail, bytes) else tail}
    wall = round(time.perf_counter() - start, 1)
    if done.returncode or not out.is_file():
        return {"side": name, "overrides": args, "wall_s": wall,
                "error": f"exit {done.returncode}", "log_tail": done.stderr[-3000:]}
    return {"side": name, "overrides": args, "wall_s": wall, **json.loads(out.read_text())}


def compared(folder: Path, porter_side: str, diffusers_side: str) -> dict | None:
    """How far the two decodes' frames are apart, in levels of 255 (the same latents)."""
    import numpy as np

    paths = [folder / f"{side}.npy" for side in (porter_side, diffusers_side)]
    if not all(p.is_file() for p in paths):
        return None
    ours, theirs = (np.load(p).astype(np.int16) for p in paths)
    if ours.shape != theirs.shape:
        return {"shapes": [list(ours.shape), list(theirs.shape)]}
    levels = np.abs(ours - theirs)
    return {"max_levels": int(levels.max()), "mean_levels": round(float(levels.mean()), 4)}


def try_peers(folder: Path | None) -> list[dict]:
    """Each specialised system, installed from the carried wheels alone (the GPU machine
    reaches no index): what its wheel asks for that this machine lacks or has at another
    version, and pip's own answer."""
    found = []
    for name, requirement in PEERS.items():
        wheels = sorted(folder.glob(f"{name}-*.whl")) if folder else []
        if not wheels:
            found.append({"peer": name, "error": f"no {name} wheel carried"})
            continue
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index",
                               "--find-links", str(folder), requirement],
                              capture_output=True, text=True)
        found.append({"peer": name, "wheel": wheels[0].name, "installs": done.returncode == 0,
                      "unmet": unmet(wheels[0], requirement),
                      "pip": (done.stdout + done.stderr).strip()[-1500:]})
    return found


def unmet(wheel: Path, requirement: str) -> list[str]:
    """The requirements of ``wheel`` (with the extras ``requirement`` names) that the
    installed packages do not meet: 'torch==2.12.0 (2.11.0 here)', 'ray (missing)'."""
    import importlib.metadata as md
    import zipfile

    from packaging.requirements import Requirement

    extras = set(requirement.partition("[")[2].rstrip("]").split(",")) - {""}
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(meta).decode().splitlines()
    problems = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        needed = Requirement(line.split(":", 1)[1].strip())
        if needed.marker and not any(needed.marker.evaluate({"extra": e})
                                     for e in extras | {""}):
            continue
        try:
            have = md.version(needed.name)
        except md.PackageNotFoundError:
            problems.append(f"{needed} (missing)")
            continue
        if needed.specifier and not needed.specifier.contains(have, prereleases=True):
            problems.append(f"{needed} ({have} here)")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for whole-video.json")
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/porter-wan1.3b"),
                        help="the model folder (written there first if absent)")
    parser.add_argument("--deadline", type=float, default=540,
                        help="seconds for everything; a side that would run past is cut off")
    parser.add_argument("--peers", type=Path, help="folder of the peers' carried wheels")
    parser.add_argument("--only", nargs="+", choices=sorted(SIDES), help="these sides only")
    parser.add_argument("--stand-in-text-encoder", action="store_true",
                        help="write the model folder with a one-layer text encoder (the "
                        "decode sides need no real one)")
    parser.add_argument("--rehearse", action="store_true",
                        help="a small model on the CPU: check the script, not the GPU")
    args = parser.parse_args()
    end = time.perf_counter() + args.deadline
    # each side's own output (the decodes' frames: 97 MB at 480p) stays out of --out
    scratch = Path(tempfile.mkdtemp(prefix="whole-video-"))
    results = {"recipe": str(RECIPE.relative_to(REPO)), "rehearsal": args.rehearse}
    path = args.out / "whole-video.json"
    results["peers"] = try_peers(args.peers)
    save(path, results)
    if not (args.checkpoint / "model_index.json").is_file():
        results["checkpoint"] = write_checkpoint(args.checkpoint, args.rehearse,
                                                 not args.stand_in_text_encoder)
        save(path, results)
    for name in args.only or WHOLE:
        left = end - time.perf_counter()
        print(f"whole_video: {name} ({left:.0f} s left)", file=sys.stderr, flush=True)
        results[name] = run_side(name, args.checkpoint, args.rehearse, scratch, left) \
            if left > 10 else {"side": name, "error": "not run: no time left"}
        save(path, results)
        print(json.dumps(results[name])[:600], file=sys.stderr, flush=True)
    for ours, theirs in (("porter-decode", "diffusers-decode"),
                         ("porter-decode-bf16", "diffusers-decode-bf16")):
        found = compared(scratch, ours, theirs)
        if found is not None:
            results[f"{ours} vs {theirs}"] = found
    save(path, results)


if __name__ == "__main__":
    main()
