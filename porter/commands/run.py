"""`porter run`: recipe -> plugin -> pipeline -> JAX (compiled) -> video + record."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from porter import api
from porter.errors import UsageError
from porter.generate import runners
from porter.generate.call import Call
from porter.port import checks
from porter.rundir import outputs, record, results
from porter.runtime import distributed, notices


@dataclass
class RunResult:
    directory: Path
    video: Path | None  # None when the run stopped before decoding
    record: Path | None
    latents: object  # CPU torch tensor: the final latents (None after encode only)
    frames: object  # uint8 array (count, height, width, 3), or None
    data: dict  # the run record


def run(recipe, registry, progress: bool = True, stage: str | None = None,
        resume: bool = False) -> RunResult:
    """Run the recipe: every stage, one ``stage``, or (``resume``) what is left.

    The run owns its output directory while it runs (another run into it is
    refused), and first removes the files of an older run that its own replace."""
    family = checks.checked_family(recipe, registry)
    say = notices.status if progress else notices.quiet
    directory = outputs.output_dir(recipe)
    if not family.staged and (stage or resume):
        raise UsageError(f"family {family.name!r} runs the pipeline in one piece: "
                         "--stage and --resume need a family with stages",
                         hint="run it without --stage/--resume")
    _resume_problem(directory, resume)
    distributed.initialize()  # before anything asks JAX which process this is
    with owned(directory):
        runner = runners.of(family)
        wanted = runner.stages_to_run(directory, stage, resume)
        resumed = runner.continuation(directory, wanted, recipe, resume)  # before removal
        if distributed.writes():
            results.invalidate(directory, wanted, keep_progress=resumed.progress is not None)
        if resume:
            say(f"resuming in {directory}: running {', '.join(wanted)}")
        port = api.Port.open(recipe, registry, family, say)
        # one progress bar, not one per process
        outcome = port.run(Call(recipe, wanted, directory, resumed,
                                progress=progress and distributed.writes(), say=say))
        return finish(port, recipe, outcome, directory)


def _resume_problem(directory: Path, resume: bool) -> None:
    if resume and not directory.is_dir():
        raise UsageError(f"nothing to resume: {directory} does not exist"
                         if not directory.exists() else
                         f"nothing to resume: {directory} is not a directory",
                         hint="--resume takes the output directory of an earlier run; "
                              "to start a new run, leave --resume out")


@contextlib.contextmanager
def owned(directory: Path):
    """Process 0 holds the run directory's lock for the block; every process stops if
    it cannot (none is left waiting in a collective for it)."""
    with contextlib.ExitStack() as owner:
        refused = None
        if distributed.writes():
            try:
                owner.enter_context(outputs.owned(directory))
            except UsageError as exc:
                refused = exc
        if distributed.anywhere(refused is not None):
            raise refused or UsageError(f"process 0 cannot write {directory}",
                                        hint="see process 0's message")
        yield


def finish(port, recipe, outcome, directory: Path) -> RunResult:
    """Write what a finished generation made into its run directory (process 0): the
    results the recipe's ``output`` asks for, then the record, which makes them one
    complete run."""
    if outcome.frames is None:
        return RunResult(directory, None, None, outcome.latents, None,
                         {"timings": outcome.timings,
                          "weights": record.weights(port.ported.weights, outcome.timings)})
    if not distributed.writes():
        return RunResult(directory, None, None, outcome.latents, outcome.frames,
                         port.record(recipe, outcome))
    written = results.write_results(directory, recipe, outcome.frames, outcome.latents)
    written["files"].update(outcome.stage_files)
    data = port.record(recipe, outcome, written)
    record_path = record.write_json(directory / outputs.RECORD, data)
    video_path = directory / written["video"] if written["video"] else None
    return RunResult(directory, video_path, record_path, outcome.latents, outcome.frames,
                     data)
