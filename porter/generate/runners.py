"""How a port makes a video: the core's staged loop, or the pipeline's own loop.

A staged family (``ModelFamily.staged``) runs through ``STAGED``, any other through
``PIPELINE`` (``of``); a port runs every call through it, and the commands ask it
which stages a run has and what it continues from. ``finish`` writes a finished
generation into its run directory (its results, then the record that makes them one
complete run); ``run_into`` runs one generation into its own directory, as a batch's
items and a server's jobs are run.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from porter.errors import Interrupted, UsageError
from porter.families.base import takes_frames
from porter.generate import prompts, stages, streaming
from porter.generate.call import Call, Outcome, Resumed
from porter.rundir import artifacts, audio, outputs, record, results
from porter.rundir import progress as saved_progress
from porter.runtime import atomic, distributed, interrupt, notices
from porter.shims.interop import to_device, to_host
from porter.transforms import scheduler as scheduling

if TYPE_CHECKING:
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe


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
    def continuation(directory: Path, wanted: tuple[str, ...], recipe: Recipe,
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

    def generate(self, port, call: Call):
        """(final latents, frames) of the wanted stages; a stage not run reads its input
        from ``call.resumed``."""
        previous = call.resumed.previous if call.resumed else None
        conditioning = latents = frames = None
        if "encode" in call.wanted:
            _stop_if_asked(call)
            prompts.warn_if_cut(port, call)
            call.say("encoding the prompt")
            conditioning = stages.encode(port, call)
            self._saved(port, call, "encode", conditioning)
        if "denoise" in call.wanted:
            _stop_if_asked(call, "the encode stage" if "encode" in call.wanted else None)
            if conditioning is None:
                conditioning = {k: to_device(v, port.runtime)
                                for k, v in previous["tensors"].items()}
            latents = stages.denoise(port, call, conditioning, self._checkpoint(port, call))
            self._saved(port, call, "denoise", {"latents": latents})
            if call.directory is not None:
                saved_progress.discard(call.directory)
        if "decode" in call.wanted:
            _stop_if_asked(call, "the denoise stage" if "denoise" in call.wanted else None)
            if latents is None:
                latents = previous["tensors"]["latents"]
            call.say("decoding latents to frames")
            frames = stages.decode(port, call, latents)
            call.history.append(record.segment(port.runtime, "decode"))
        if call.directory is not None:
            call.stage_files = artifacts.digests(call.directory)
        return latents, frames

    @staticmethod
    def _saved(port, call: Call, stage: str, tensors: dict) -> None:
        """The stage's output in the run directory, with where every stage so far ran."""
        if stage == "encode":
            call.history.append(record.segment(port.runtime, "encode"))
        if call.directory is not None:
            extra = {"history": call.history}
            if stage == "denoise":
                extra["schedule"] = call.schedule
            artifacts.save(call.directory, stage, tensors, call.recipe, extra=extra,
                           inputs=port.inputs)

    @staticmethod
    def _checkpoint(port, call: Call):
        """``save(progress)`` for the denoising loop: a checkpoint in the run directory
        with where the steps so far ran (None: the call keeps nothing)."""
        if call.directory is None:
            return None

        def save(done) -> None:
            done.history = stages.denoised_history(port, call, done.step)
            saved_progress.save(call.directory, done, call.recipe, port.inputs)
        return save


def _stop_if_asked(call: Call, kept: str | None = None) -> None:
    """A stop asked for by code (a served job cancelled, a server closing: ``interrupt.
    request_stop``) takes effect before the next stage, not only at a denoising step's
    end: a job cancelled while it encodes never starts denoising. ``kept``: the stage
    saved before it (where the call saves its stages)."""
    signum = interrupt.agreed_request()  # every process stops there, or none
    if signum:
        raise Interrupted(signum, saved=kept if call.directory is not None else None)


class PipelineLoop:
    """The pipeline's own ``__call__``, in one piece: nothing is saved on the way, so
    an interrupted run starts over; its guidance is the pipeline's."""

    stages = ("generate",)

    @staticmethod
    def stages_to_run(directory: Path, stage: str | None, resume: bool) -> tuple:
        return ()  # one piece (not staged: --stage and --resume are refused)

    @staticmethod
    def continuation(directory: Path, wanted: tuple, recipe: Recipe,
                     resume: bool) -> Resumed:
        return Resumed()

    def generate(self, port, call: Call):
        prompts.warn_if_cut(port, call)
        call.say("running the pipeline")
        start = time.perf_counter()
        # the frames go on as the pipeline hands them over (chunk by chunk where it
        # decodes so, else at its end), where anything takes them
        with port.runtime.env, streaming.stream(call) as on_frames:
            if streaming.wanted(call) and takes_frames(port.family):
                made = port.family.generate(port.pipe, call.recipe, on_frames=on_frames)
            else:
                made = port.family.generate(port.pipe, call.recipe)
                if made.frames is not None:
                    on_frames(made.frames)
        call.timings["generate_s"] = round(time.perf_counter() - start, 4)
        call.audio = _sound(port.pipe, call.recipe, made.waveform, made.sample_rate)
        scheduler = getattr(port.pipe, "scheduler", None)
        if getattr(scheduler, "timesteps", None) is not None:  # as the pipeline left it
            call.schedule = scheduling.describe(scheduler, scheduler.timesteps)
        call.history.append(record.segment(port.runtime, "generate"))
        return (to_host(made.latents) if made.latents is not None else None), made.frames


def _sound(pipe, recipe: Recipe, waveform, given_rate) -> audio.Audio | None:
    """The pipeline's waveform as ``Audio`` where it made one and the recipe keeps it
    (``output.audio``). A sound Porter cannot write (no rate said, its shape, values
    that are not finite) is dropped with a warning: the frames are still written."""
    if waveform is None or not recipe.output.audio:
        return None
    rate = audio.sample_rate(pipe, given_rate)
    if rate is None:
        notices.warn("the pipeline made sound, but neither its output nor its components "
                     "say the sample rate; the video is written without it")
        return None
    try:
        return audio.of(waveform, rate)
    except audio.Unusable as exc:
        notices.warn(f"the pipeline made sound Porter cannot write ({exc}); the video is "
                     "written without it")
        return None


STAGED = StagedLoop()
PIPELINE = PipelineLoop()


def of(family: ModelFamily):
    """How ``family`` generates: the core's staged loop, or the pipeline's own."""
    return STAGED if family.staged else PIPELINE


# ------------------------------------------------ a generation into its own directory

@dataclass
class RunResult:
    directory: Path
    video: Path | None  # None when the run stopped before decoding
    record: Path | None
    latents: object  # CPU torch tensor: the final latents (None after encode only)
    frames: object  # uint8 array (count, height, width, 3), or None
    data: dict  # the run record
    # finished before this call (--resume): nothing was run; latents and frames None,
    # video and record the files the directory holds (None on a process but 0)
    finished: bool = False


def finish(port, recipe: Recipe, outcome: Outcome, directory: Path) -> RunResult:
    """Write what a finished generation made into its run directory (process 0): the
    results the recipe's ``output`` asks for, then the record, which makes them one
    complete run."""
    if outcome.frames is None:
        return RunResult(directory, None, None, outcome.latents, None,
                         {"timings": outcome.timings,
                          "weights": record.weights(port.ported.weights, outcome.timings)})
    if not distributed.writes():
        return RunResult(directory, None, None, outcome.latents, outcome.frames,
                         port.run_record(recipe, outcome))
    start = time.perf_counter()
    written = results.write_results(directory, recipe, outcome.frames, outcome.latents,
                                    outcome.audio)
    outcome.timings["write_s"] = round(time.perf_counter() - start, 4)  # the mp4 and the rest
    written["files"].update(outcome.stage_files)
    streamed = (outcome.timings.get("stream") or {}).get("file")
    if streamed and (directory / streamed).is_file():  # the frames as they were decoded
        written["files"][streamed] = atomic.sha256(directory / streamed)
    data = port.run_record(recipe, outcome, written)
    record_path = record.write_json(directory / outputs.RECORD, data)
    video_path = directory / written["video"] if written["video"] else None
    return RunResult(directory, video_path, record_path, outcome.latents, outcome.frames,
                     data)


class Made(NamedTuple):
    outcome: Outcome
    record_sha256: str | None  # the run.json written, hashed while the folder was held


def run_into(port, call: Call, resume: bool, name: str = "item",
             what: str = "porter run") -> Made:
    """One generation into its own run directory (``call.directory``), as ``porter run``
    (``--resume``) writes one: owned while it runs (its lock saying ``what`` holds it),
    every stage saved, video and record at the end. With ``resume``, it continues after
    the directory's last complete stage or checkpoint; files left by other settings
    start it over."""
    directory = call.directory
    with contextlib.ExitStack() as owner:
        if distributed.writes():
            owner.enter_context(outputs.owned(directory, what))
        call.wanted, call.resumed = _continuation(port, call, resume, name)
        if distributed.writes():
            results.invalidate(directory, call.wanted,
                               keep_progress=call.resumed.progress is not None)
        outcome = port.run(call)
        written = finish(port, call.recipe, outcome, directory)
        digest = atomic.sha256(written.record) if written.record else None
    return Made(outcome, digest)


def _continuation(port, call: Call, resume: bool, name: str):
    """(the stages to run, what they continue from): after the directory's last
    complete stage or checkpoint when resuming and its files fit, else all."""
    runner, directory = of(port.family), call.directory
    if not (resume and port.family.staged and directory.is_dir()):
        return runner.stages_to_run(directory, None, False), Resumed()
    wanted = runner.stages_to_run(directory, None, True)
    try:
        return wanted, runner.continuation(directory, wanted, call.recipe, True)
    except UsageError as exc:
        call.say(f"{name}: starting over ({exc.message})")
        return runner.stages_to_run(directory, None, False), Resumed()
