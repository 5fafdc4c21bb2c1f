"""How a port makes a video: the core's staged loop, or the pipeline's own loop.

A staged family (``ModelFamily.staged``) runs through ``STAGED``, any other through
``PIPELINE`` (``of``); a port runs every call through it, and the commands ask it
which stages a run has and what a run directory holds.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from porter.generate import stages
from porter.rundir import artifacts, record
from porter.rundir import progress as saved_progress
from porter.shims.interop import to_device, to_host


@dataclass
class Resumed:
    """What a run continues from: the stage before its first (record and tensors) and
    the denoising checkpoint, both read and checked before any weight is loaded."""
    previous: dict | None = None  # {"meta": record, "tensors": {...}}
    progress: object = None  # porter.rundir.progress.Progress


class StagedLoop:
    """Encode, denoise, decode, each saved as it finishes; denoising checkpoints its
    progress; ``--stage`` runs one, ``--resume`` what is left. Porter owns the loop
    and the guidance (``porter.generate.stages``, ``porter.generate.guidance``)."""

    stages = artifacts.STAGES

    @staticmethod
    def stages_to_run(directory: Path, stage: str | None, resume: bool) -> tuple[str, ...]:
        """One named stage; after the last complete one (resume); or all three."""
        if stage is not None:
            return (stage,)
        if resume:
            done = [s for s in artifacts.STAGES[:-1] if artifacts.complete(directory, s)]
            start = artifacts.STAGES.index(done[-1]) + 1 if done else 0
            return artifacts.STAGES[start:]
        return artifacts.STAGES

    @staticmethod
    def continuation(directory: Path, wanted: tuple[str, ...], recipe,
                     resume: bool) -> Resumed:
        """The inputs on disk this run needs, checked now: a bad file fails before
        loading."""
        found = Resumed()
        first = artifacts.STAGES.index(wanted[0]) if wanted else 0
        if first:
            meta, tensors = artifacts.load_with_record(
                directory, artifacts.STAGES[first - 1], recipe)
            found.previous = {"meta": meta, "tensors": tensors}
        if resume and "denoise" in wanted:
            found.progress = saved_progress.load(directory, recipe)
        return found

    def generate(self, port, recipe, timings, history, wanted, directory, resumed,
                 progress, on_step, say, reuse):
        """(final latents, frames, history) of the wanted stages; a stage not run
        reads its input from ``resumed``."""
        family, pipe, runtime = port.family, port.pipe, port.runtime
        previous = resumed.previous if resumed else None
        conditioning = latents = frames = None
        if "encode" in wanted:
            say("encoding the prompt")
            conditioning = stages.encode(family, pipe, recipe, runtime, timings)
            history.append(record.segment(runtime, "encode"))
            if directory is not None:
                artifacts.save(directory, "encode", conditioning, recipe,
                               extra={"history": history}, inputs=port.inputs)
        if "denoise" in wanted:
            if conditioning is None:
                conditioning = {k: to_device(v, runtime)
                                for k, v in previous["tensors"].items()}
            latents, history = self._denoise(port, recipe, conditioning, timings, history,
                                             directory, resumed, progress, on_step, say,
                                             reuse)
        if "decode" in wanted:
            if latents is None:
                latents = previous["tensors"]["latents"]
            say("decoding latents to frames")
            frames = stages.decode(family, pipe, latents, recipe, runtime, timings)
            history.append(record.segment(runtime, "decode"))
        return latents, frames, history

    @staticmethod
    def _denoise(port, recipe, conditioning, timings, history, directory, resumed,
                 progress, on_step, say, reuse):
        start = resumed.progress if resumed else None
        if start is not None:
            say(f"continuing denoising after step {start.step}")
            history = list(start.history) or history
        first_step = start.step if start else 0
        runtime = port.runtime

        def ran(done: int) -> list:
            return history + [record.segment(runtime, "denoise", steps=[first_step, done])]

        save = None
        if directory is not None:
            def save(done):
                done.history = ran(done.step)
                saved_progress.save(directory, done, recipe, port.inputs)
        latents = stages.denoise(port.family, port.pipe, conditioning, recipe, runtime,
                                 timings, progress, start=start, save=save, on_step=on_step,
                                 reuse=reuse)
        history = ran(first_step + len(timings["steps_s"]))
        if directory is not None:
            artifacts.save(directory, "denoise", {"latents": latents}, recipe,
                           extra={"history": history}, inputs=port.inputs)
            saved_progress.discard(directory)
        return latents, history

    @staticmethod
    def stage_digests(directory) -> dict:
        """SHA-256 of each stage file in the directory, from its record."""
        found = {}
        for stage in artifacts.STAGES[:-1]:
            if artifacts.complete(directory, stage):
                meta = json.loads((directory / f"{stage}.json").read_text())
                found[f"{stage}.safetensors"] = meta.get("sha256")
        return found


class PipelineLoop:
    """The pipeline's own ``__call__``, in one piece: nothing is saved on the way, so
    an interrupted run starts over; its guidance is the pipeline's."""

    stages = ("generate",)

    @staticmethod
    def stages_to_run(directory: Path, stage: str | None, resume: bool) -> tuple:
        return ()  # one piece (not staged: --stage and --resume are refused)

    @staticmethod
    def continuation(directory: Path, wanted: tuple, recipe, resume: bool) -> Resumed:
        return Resumed()

    def generate(self, port, recipe, timings, history, wanted, directory, resumed,
                 progress, on_step, say, reuse):
        say("running the pipeline")
        start = time.perf_counter()
        with port.runtime.env:
            frames, latents = port.family.generate(port.pipe, recipe)
        timings["generate_s"] = round(time.perf_counter() - start, 4)
        history.append(record.segment(port.runtime, "generate"))
        return (to_host(latents) if latents is not None else None), frames, history

    @staticmethod
    def stage_digests(directory) -> dict:
        return {}


STAGED = StagedLoop()
PIPELINE = PipelineLoop()


def of(family):
    """How ``family`` generates: the core's staged loop, or the pipeline's own."""
    return STAGED if family.staged else PIPELINE
