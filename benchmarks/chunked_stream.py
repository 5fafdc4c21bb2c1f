"""The streams of the pipelines that finish their video chunk by chunk and decode it
whole at their end (SkyReels-V2's diffusion forcing, AnyFlow FAR): Porter decodes each
finished chunk as the pipeline moves on (docs/python-api.md, streaming). Each tiny test
model (tests/models) at 64x64, a long video, as a user runs it (``porter run`` in fresh
processes, cold and with warm compile caches), against the same run with no stream
(``output.stream=false``: the pipeline's own whole decode at its end, the only frames
before this existed).

    python benchmarks/chunked_stream.py

Results: benchmarks/results/chunked-stream-cpu.json.
"""

import json
import tempfile
from pathlib import Path

import stream_runs
from results_io import save

ROOT = Path(__file__).resolve().parent.parent

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


def main():
    work = Path(tempfile.mkdtemp(prefix="chunked-"))
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
