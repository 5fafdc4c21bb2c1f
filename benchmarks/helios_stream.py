"""An autoregressive model's stream on a TPU, bounded before anyone rents one: Helios
14B (distilled: its pyramid pipeline, three stages of two steps, no guidance) at its
own size (384x640, chunks of 33 frames) compiled by ``porter compile`` for each
target, with what the compile gives: the per-chunk programs, the seconds a chunk
takes at the bound (its steps and its decode), the first frames' time and the frames a
second that bound allows.

    python benchmarks/helios_stream.py [--targets v6e-8,v7x-8] [--frames 132]
    python benchmarks/helios_stream.py --cpu [--frames 132]

``--cpu`` runs the stream on this machine instead, as a user runs it (``porter run``
in a fresh process, twice: the second with warm compile caches): diffusers' tiny
Helios test model (tests/models/helios.py) at 64x64 with Helios's own chunks (9 latent
frames, 33 frames a chunk), and what the run record says of the stream.

The model folder is weightless and written here: Helios's transformer at diffusers'
own defaults for ``HeliosTransformer3DModel`` (Wan 2.1 14B's sizes, which Helios
fine-tunes), the distilled scheduler (``HeliosDMDScheduler``) at its defaults but
gamma (0.3: see ``layout``),
and the Wan 2.1 VAE, UMT5-XXL and tokenizer stand-in Porter ships for another
Wan-based checkpoint (porter/loading/layouts). The recipe is
recipes/wan-generic-base.yaml's (bfloat16, tp over the chips, the VAE split over width)
with Helios's call. Results: benchmarks/results/helios-stream-tpu.json.
"""

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import stream_runs
from results_io import save

ROOT = Path(__file__).resolve().parent.parent
#: the Wan 2.1 components a shipped layout already has (VAE, UMT5-XXL, tokenizer)
WAN_PARTS = ROOT / "porter" / "loading" / "layouts" / "Wan-AI--Wan2.2-Animate-2-14B-Diffusers"
#: Helios-Distilled's call (the model card's: three pyramid stages of two steps, no
#: guidance, the first chunk amplified)
CALL = {"guidance_scale": 1.0, "extra": {"pyramid_num_inference_steps_list": [2, 2, 2],
                                         "is_amplify_first_chunk": True}}


def layout(folder: Path) -> Path:
    """Helios-Distilled's folder as diffusers saves it, with no weights."""
    import torch
    from diffusers import HeliosDMDScheduler, HeliosTransformer3DModel

    folder.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        HeliosTransformer3DModel().save_config(folder / "transformer")
    # gamma 0.3, not the default 1/3: with 1/3 the pyramid's block-noise covariance is
    # singular and the host's Cholesky fails (noise values only: no shape changes)
    HeliosDMDScheduler(gamma=0.3).save_config(folder / "scheduler")
    for part in ("vae", "text_encoder", "tokenizer"):
        shutil.copytree(WAN_PARTS / part, folder / part, dirs_exist_ok=True)
    (folder / "model_index.json").write_text(json.dumps({
        "_class_name": "HeliosPyramidPipeline", "is_distilled": True,
        "is_cfg_zero_star": False, "scheduler": ["diffusers", "HeliosDMDScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "HeliosTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"]}, indent=1))
    return folder


def recipe(folder: Path, frames: int) -> Path:
    extra = json.dumps(CALL["extra"])
    path = folder.parent / "helios-distilled.yaml"
    path.write_text(
        f"extends: {ROOT / 'recipes' / 'wan-generic-base.yaml'}\n"
        f"model: {{source: {folder}, pipeline: HeliosPyramidPipeline}}\n"
        f"generate: {{prompt: a fox running through snow,\n"
        f"  height: 384, width: 640, frames: {frames}, steps: null,\n"
        f"  guidance_scale: {CALL['guidance_scale']}, extra: {extra}}}\n"
        # Helios's rotation in halves order (porter/families/rotary_halves.py)
        "patches: [core.report_compiling, core.helios_rotary_halves]\n")
    return path


def _program(row: dict, target: dict) -> dict:
    """A compiled program's row, with the three times its bound is the largest of."""
    kept = {key: row.get(key) for key in ("program", "stage", "calls", "first_chunk",
                                          "frames", "call_bound_s", "fits", "flops",
                                          "bytes_accessed")}
    kept["hidden_states"] = (row.get("inputs") or {}).get("hidden_states")
    sent = sum(c["bytes_sent_per_chip"] for c in (row.get("collectives") or {}).values())
    kept["bytes_sent_per_chip"] = sent
    kept["memory_s"] = (row.get("bytes_accessed") or 0) / target["hbm_bytes_per_s"]
    kept["interconnect_s"] = sent / target["ici_bytes_per_s"]
    return kept


def on_cpu(frames: int, work: Path) -> None:
    """The tiny Helios's stream on this machine, cold and warm."""
    tiny = stream_runs.saved("models.helios:build_helios_pipeline", work / "tiny")
    path = work / "tiny.yaml"
    path.write_text(
        f"model: {{family: generic, source: {tiny}, pipeline: HeliosPipeline}}\n"
        f"generate: {{prompt: a cat, height: 64, width: 64, frames: {frames}, steps: 2,\n"
        "           guidance_scale: 1.0, max_sequence_length: 16}\n"
        "output: {fps: 24}\n"
        f"runtime: {{compile_cache: {work / 'cache'}}}\n")
    rows = stream_runs.cold_and_warm(path, work, {
        "model": "tiny Helios (diffusers' test config)", "size": "64x64",
        "chunk_frames": 33})
    save(ROOT / "benchmarks" / "results" / "helios-stream-cpu.json", rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="v6e-8,v7x-8")
    parser.add_argument("--frames", type=int, default=132, help="four chunks of 33")
    parser.add_argument("--cpu", action="store_true",
                        help="the tiny model's stream on this machine instead")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="helios-"))
    if args.cpu:
        return on_cpu(args.frames, work)
    path = recipe(layout(work / "Helios-Distilled"), args.frames)

    def row(target, report, video):
        return {
            "target": target, "size": "640x384", "frames": args.frames, **CALL,
            "programs": [_program(row, report["target"]) for row in report["programs"]],
            "not_compiled": report["not_compiled"], "weights_per_chip": report[
                "weights_per_chip"]["total"], "stages_s": video.get("stages_s"),
            "video_bound_s": video.get("bound_s"), "video_frames": video.get("frames"),
            "missing": video.get("missing"),
            "stream": video.get("stream"), "compile_s": report["compile_s"]}

    stream_runs.compiled_on(args.targets.split(","),
                            ROOT / "benchmarks" / "results" / "helios-stream-tpu.json",
                            [str(path)], row)


if __name__ == "__main__":
    main()
