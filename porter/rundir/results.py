"""What a finished run writes into its run directory (``write_results``), what a
run removes first because its own outputs replace it (``invalidate``), and whether a
directory already holds a recipe's finished run (``finished``)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from porter.rundir import artifacts, audio, outputs, progress, video
from porter.rundir.audio import Audio
from porter.runtime import atomic, notices

if TYPE_CHECKING:
    from porter.recipe import Recipe


#: output settings that change no result a finished run keeps (``stream.mp4`` is the
#: video's frames as they came: neither wanting it nor its removal unfinishes a run)
UNWRITTEN = ("dir", "checkpoint_every", "preview_every", "stream")
#: recipe sections beyond the stage files' settings that change the video made
MAKING = ("setup", "patches")


def finished(directory: Path, recipe: Recipe, made_from: Callable[[], dict]) -> dict | None:
    """The record of the complete run ``directory`` holds, when it is this recipe's
    (the same model, generation settings, dtypes, LoRA, step cache and scheduler, as a
    stage file is judged, the same setup calls and patches, the same output settings)
    made from the files ``made_from()`` names (``artifacts.inputs_of``; asked last, as
    it may hash adapters: a replaced adapter or checkpoint file makes the run again),
    with every result it lists still there (a stage's own file, or the stream, may have
    been removed to save space); else None."""
    kept = {f"{stage}.safetensors" for stage in artifacts.STAGES} | {outputs.STREAM}
    try:
        data = json.loads((directory / outputs.RECORD).read_text())
        made, wanted = data["recipe"], recipe.resolved()
        same = artifacts.settings_of(made) == artifacts.settings_of(wanted) \
            and _making(made) == _making(wanted)
        results = [name for name in data["outputs"]["files"] if name not in kept]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not same or not all((directory / name).is_file() for name in results) \
            or _identity(artifacts.inputs_of(data.get("checkpoint"))) != _identity(
                made_from()):
        return None
    return data


def _making(resolved: dict) -> dict:
    """What of a resolved recipe, beyond ``artifacts.settings``, changes the results."""
    output = {key: value for key, value in resolved["output"].items()
              if key not in UNWRITTEN}
    return {"output": output, **{key: resolved.get(key) for key in MAKING}}


def _identity(inputs: dict) -> dict:
    """The files' identity: the checkpoint's, and each adapter by its SHA-256 (not the
    path it was read from, which a moved recipe or another cache changes)."""
    return {"checkpoint_files": inputs["checkpoint_files"],
            "lora": [adapter["sha256"] for adapter in inputs["lora"]]}


def invalidate(directory: Path, stages: tuple[str, ...], keep_progress: bool) -> None:
    """Remove what this run will write anew, and what depends on it: the record and
    video always (record first), each stage from the first one run on, and the
    denoising checkpoints unless the run continues from them."""
    for name in (outputs.RECORD, outputs.VIDEO, outputs.STREAM, outputs.FRAMES_NPY,
                 outputs.LATENTS, outputs.WAV):
        (directory / name).unlink(missing_ok=True)
    frames = directory / outputs.FRAMES_DIR
    if frames.is_dir():
        for frame in frames.glob("*.png"):
            frame.unlink()
        outputs.remove_partials(frames)
        with contextlib.suppress(OSError):
            frames.rmdir()  # when empty: a run without png frames leaves none
    first = artifacts.STAGES.index(stages[0]) if stages else len(artifacts.STAGES)
    for stage in artifacts.STAGES[first:]:
        artifacts.remove(directory, stage)
    if "denoise" in artifacts.STAGES[first:]:
        (directory / outputs.PREVIEW).unlink(missing_ok=True)  # an earlier run's picture
        if not keep_progress:
            progress.discard(directory)
    outputs.remove_partials(directory)


def write_results(directory: Path, recipe: Recipe, frames, latents,
                  sound: Audio | None = None) -> dict:
    """Write what the recipe's ``output`` asks for: the video (``output.video``, with
    its ``sound`` where the pipeline made one), lossless frames (``output.frames``: png
    or npy), the sound losslessly (``output.wav``) and the final latents
    (``output.latents``). Returns the names written (None for what was not), ``audio``
    (the sound described, or None) and ``files``: each file's SHA-256, for the
    record."""
    output = recipe.output
    files: dict = {}
    written = {"video": None, "lossless_frames": None, "latents": None, "audio": None,
               "files": files}
    if sound is not None:
        written["audio"] = {**sound.describe(), "in_video": bool(output.video),
                            "codec": "aac", "video_rate": audio.aac_rate(sound.rate)
                            if output.video else None, "wav": None}
        _warn_if_unaligned(sound, frames, output.fps)
    if output.video:
        files[outputs.VIDEO] = video.write_mp4(directory / outputs.VIDEO, frames, output.fps,
                                               sound)
        written["video"] = outputs.VIDEO
    if sound is not None and output.wav:
        files[outputs.WAV] = audio.write_wav(directory / outputs.WAV, sound)
        written["audio"]["wav"] = outputs.WAV
    if output.frames == "png":
        (directory / outputs.FRAMES_DIR).mkdir(exist_ok=True)
        for index, frame in enumerate(frames):
            name = f"{outputs.FRAMES_DIR}/{index:05d}.png"
            files[name] = atomic.write_bytes(directory / name, _png(frame))
        written["lossless_frames"] = outputs.FRAMES_DIR + "/"
    elif output.frames == "npy":
        files[outputs.FRAMES_NPY] = atomic.write_bytes(directory / outputs.FRAMES_NPY, _npy(frames))
        written["lossless_frames"] = outputs.FRAMES_NPY
    if output.latents:
        if latents is None:
            notices.warn("output.latents: this pipeline does not report its latents "
                         "(no callback_on_step_end); none written")
        else:
            from safetensors.torch import save

            files[outputs.LATENTS] = atomic.write_bytes(directory / outputs.LATENTS, save(
                {"latents": latents.detach().cpu().contiguous()}))
            written["latents"] = outputs.LATENTS
    return written


def _warn_if_unaligned(sound: Audio, frames, fps: int) -> None:
    """The sound and the frames at output.fps should last as long: a pipeline's own
    frame rate (e.g. LTX-2's frame_rate) is not Porter's output.fps."""
    seconds = len(frames) / fps
    if abs(sound.seconds - seconds) > 1.5 / fps:
        notices.warn(f"the sound lasts {sound.seconds:.2f} s and the {len(frames)} frames "
                     f"{seconds:.2f} s at output.fps={fps}: set output.fps to the frame "
                     "rate the pipeline made them for")


def _png(frame) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="PNG")
    return buffer.getvalue()


def _npy(frames) -> bytes:
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(frames, dtype=np.uint8))
    return buffer.getvalue()
