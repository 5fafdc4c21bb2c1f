"""The streams of the pipelines that finish their video chunk by chunk and decode it
whole at their end (SkyReels-V2's diffusion forcing, AnyFlow FAR): Porter decodes each
finished chunk as the pipeline moves on (docs/python-api.md, streaming). Each tiny test
model (tests/models) at 64x64, a long video, as a user runs it (``porter run`` in fresh
processes, cold and with warm compile caches), against the same run with no stream
(``output.stream=false``: the pipeline's own whole decode at its end, the only frames
before this existed).

    python benchmarks/chunked_stream.py
    python benchmarks/chunked_stream.py --targets v6e-8,v7x-8
    python benchmarks/chunked_stream.py --targets v6e-8 --model far
    python benchmarks/chunked_stream.py --targets v6e-8 --model far --vae-dtype bfloat16

Results: benchmarks/results/chunked-stream-cpu.json.

``--targets`` bounds SkyReels-V2 diffusion forcing 14B at its own 540p size on each TPU
target instead, as ``porter compile`` bounds it where the run streams (each window's
finished latent frames decoded when the next window starts): a weightless layout (the
14B transformer at Wan 2.1 14B's sizes, as the published model has them; UniPC with
the 540p flow shift; the Wan 2.1 VAE, UMT5-XXL and tokenizer stand-in Porter ships),
recipes/skyreels-v2-df-14b.yaml's settings with the model card's long-video call
(257 frames in windows of 97 overlapping by 17). Results:
benchmarks/results/chunked-stream-tpu.json.

``--targets T --model far`` bounds AnyFlow FAR 14B the same way at its released call:
480x832, 81 frames in chunks of 1, 3 x 6 and 2 latent frames, 4 steps, no guidance (a
weightless layout: the transformer's default sizes, which are the released 14B's, with
the same VAE, encoder and tokenizer), recipes/wan-generic-base.yaml's sharding over
tp=8: a denoising program per chunk length, a cache program per kind, each finished
chunk's decode. Results: benchmarks/results/far-stream-tpu.json.

``--vae-dtype bfloat16`` bounds either with its VAE in bfloat16 instead of the
recipe's float32 (a row of its own beside the recipe's, marked ``vae_dtype``).
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
#: the 14B transformer's sizes (Wan 2.1 14B's)
SIZES_14B = {"num_attention_heads": 40, "attention_head_dim": 128, "ffn_dim": 13824,
             "num_layers": 40}
#: the model card's long video: 257 frames in windows of 97 overlapping by 17
LONG = {"frames": 257, "extra": {"base_num_frames": 97, "overlap_history": 17,
                                 "addnoise_condition": 20}}

#: name -> (builder, pipeline class, the call's own settings, what a chunk is)
MODELS = {
    "SkyReels-V2 diffusion forcing": (
        "models.skyreels_v2_df:build_skyreels_v2_df_pipeline",
        "SkyReelsV2DiffusionForcingPipeline",
        "guidance_scale: 6.0, extra: {base_num_frames: 33, overlap_history: 17}",
        "windows of 9 latent frames overlapping by 5: 4 new ones (16 frames) a window"),
    "AnyFlow FAR": (
        "models.anyflow_far:build_anyflow_far_pipeline", "AnyFlowFARPipeline",
        "guidance_scale: 6.0, extra: {chunk_partition: [1, 3, 3, 3, 3, 3, 3, 3, 3]}",
        "chunks of 3 latent frames (12 frames) after a first of one"),
}


def layout(folder: Path) -> Path:
    """SkyReels-V2-DF-14B-540P's folder as diffusers saves it, with no weights."""
    import torch
    from diffusers import SkyReelsV2Transformer3DModel, UniPCMultistepScheduler

    folder.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        SkyReelsV2Transformer3DModel(**SIZES_14B).save_config(folder / "transformer")
    UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                            flow_shift=8.0).save_config(folder / "scheduler")
    for part in ("vae", "text_encoder", "tokenizer"):
        shutil.copytree(WAN_PARTS / part, folder / part, dirs_exist_ok=True)
    (folder / "model_index.json").write_text(json.dumps({
        "_class_name": "SkyReelsV2DiffusionForcingPipeline",
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "SkyReelsV2Transformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"]}, indent=1))
    return folder


def far_layout(folder: Path) -> Path:
    """AnyFlow-FAR-Wan2.1-14B's folder as diffusers saves it, with no weights (the
    transformer's defaults are the released 14B's sizes)."""
    import torch
    from diffusers import AnyFlowFARTransformer3DModel, FlowMapEulerDiscreteScheduler

    folder.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        AnyFlowFARTransformer3DModel().save_config(folder / "transformer")
    FlowMapEulerDiscreteScheduler(num_train_timesteps=1000, shift=5.0).save_config(
        folder / "scheduler")
    for part in ("vae", "text_encoder", "tokenizer"):
        shutil.copytree(WAN_PARTS / part, folder / part, dirs_exist_ok=True)
    (folder / "model_index.json").write_text(json.dumps({
        "_class_name": "AnyFlowFARPipeline",
        "scheduler": ["diffusers", "FlowMapEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "AnyFlowFARTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"]}, indent=1))
    return folder


def bound_row(about: dict):
    """A `porter compile` report as a row of ``about`` (the model, its call): each
    program's calls and bound, the video's stages and its stream."""
    def row(target, report, video):
        return {
            "target": target, **about, "steps": video.get("steps"),
            "programs": [{key: row.get(key) for key in (
                "program", "stage", "calls", "first_chunk", "call_bound_s", "fits",
                "flops", "bytes_accessed", "peak_bytes_per_chip")}
                for row in report["programs"]],
            "not_compiled": report["not_compiled"], "stages_s": video.get("stages_s"),
            "video_bound_s": video.get("bound_s"), "video_frames": video.get("frames"),
            "missing": video.get("missing"), "stream": video.get("stream"),
            "verdict": report["verdict"]["message"], "compile_s": report["compile_s"]}

    return row


def far_on_targets(targets: list[str], work: Path, vae_dtype: str | None = None) -> None:
    """AnyFlow FAR 14B's stream bounded on each target by `porter compile`: its
    transformer's fixed-shape calls (a denoising call per chunk length, a cache call
    per kind) and the decode of each finished chunk."""
    folder = far_layout(work / "AnyFlow-FAR-Wan2.1-14B")
    stream_runs.compiled_on(
        targets, ROOT / "benchmarks" / "results" / "far-stream-tpu.json",
        [str(ROOT / "recipes" / "wan-generic-base.yaml"), f"model.source={folder}",
         "model.pipeline=AnyFlowFARPipeline", "generate.steps=4",
         "generate.guidance_scale=1.0",
         # the base's float32 rules less its rotary one: FAR's rotary module holds no
         # tensor (it builds its table in forward)
         "dtypes.overrides.transformer=" + json.dumps([
             {"match": r"condition_embedder\.time_embedder\..*", "dtype": "float32"},
             {"match": r"(blocks\.\d+\.)?scale_shift_table", "dtype": "float32"},
             {"match": r"blocks\.\d+\.norm2\..*", "dtype": "float32"}])],
        bound_row({"model": "AnyFlow FAR 14B (weightless layout)", "size": "832x480",
                   "frames": 81, "chunks": [1, 3, 3, 3, 3, 3, 3, 2]}), vae_dtype)


def on_targets(targets: list[str], work: Path, vae_dtype: str | None = None) -> None:
    """SkyReels-V2 DF 14B's stream bounded on each target by `porter compile`."""
    folder = layout(work / "SkyReels-V2-DF-14B-540P")
    stream_runs.compiled_on(
        targets, ROOT / "benchmarks" / "results" / "chunked-stream-tpu.json",
        [str(ROOT / "recipes" / "skyreels-v2-df-14b.yaml"), f"model.source={folder}",
         f"generate.frames={LONG['frames']}", f"generate.extra={json.dumps(LONG['extra'])}"],
        bound_row({"model": "SkyReels-V2 DF 14B (weightless layout)", "size": "960x544",
                   **LONG}), vae_dtype)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", help="bound SkyReels-V2 DF 14B on these TPU "
                        "targets (v6e-8,v7x-8) instead of the tiny models' CPU runs")
    parser.add_argument("--model", choices=("skyreels", "far"), default="skyreels",
                        help="with --targets: the model bounded (default: skyreels)")
    parser.add_argument("--vae-dtype", choices=("float32", "bfloat16"),
                        help="with --targets: the VAE's dtype (default: the recipe's)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="chunked-"))
    if args.targets:
        bound = far_on_targets if args.model == "far" else on_targets
        return bound(args.targets.split(","), work, args.vae_dtype)
    rows = []
    for name, (builder, pipeline, call, chunks) in MODELS.items():
        folder = work / pipeline
        tiny = stream_runs.saved(builder, folder / "model")
        path = folder / "tiny.yaml"
        path.write_text(
            f"model: {{family: generic, source: {tiny}, pipeline: {pipeline}}}\n"
            "generate: {prompt: a cat, height: 64, width: 64, frames: 97, steps: 2,\n"
            f"           max_sequence_length: 16, {call}}}\n"
            "output: {fps: 24}\n"
            f"runtime: {{compile_cache: {folder / 'cache'}}}\n")
        about = {"model": f"tiny {name} (diffusers' test config)", "size": "64x64",
                 "chunks_are": chunks}
        rows += stream_runs.cold_and_warm(path, folder / "streamed", about)
        rows += stream_runs.cold_and_warm(path, folder / "whole",
                                          {**about, "stream": "none: output.stream=false"},
                                          "output.stream=false")
        save(ROOT / "benchmarks" / "results" / "chunked-stream-cpu.json", rows)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
