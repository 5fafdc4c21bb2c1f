"""`porter run`: recipe -> plugin -> pipeline -> JAX (compiled) -> video + record."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from porter import api
from porter.errors import Interrupted, UsageError
from porter.generate import runners
from porter.generate.runners import RunResult, finish
from porter.generate.call import Call
from porter.port import checks
from porter.rundir import artifacts, outputs, results
from porter.rundir.lifecycle import owned, resume_problem
from porter.runtime import distributed, notices

if TYPE_CHECKING:
    from porter.recipe import Recipe
    from porter.registry import Registry

__all__ = ["RunResult", "run"]


def run(recipe: Recipe, registry: Registry, progress: bool = True, stage: str | None = None,
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
    resume_problem(directory, resume)
    runner = runners.of(family)
    if not directory.exists():  # a stage that needs earlier ones: refused before the
        # folder is made for it (the same check runs again under the folder's lock)
        runner.continuation(directory, runner.stages_to_run(directory, stage, resume),
                            recipe, resume)
    distributed.initialize()  # before anything asks JAX which process this is
    with owned(directory):
        if resume and stage is None:
            done = _finished(directory, recipe)
            if done is not None:  # said by the caller, with the files it holds
                return done
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


def _finished(directory: Path, recipe: Recipe) -> RunResult | None:
    """The finished run ``directory`` holds of this recipe, made from the files on disk
    now (no weight loaded: ``artifacts.inputs_now``), as process 0 judges it for every
    process; else None. Every process takes part in the judgement, whatever process 0
    meets reading the files: a problem there is the run's own to say, on every process,
    as it continues (a process that raised here would leave the others waiting)."""
    data = None
    if distributed.writes():
        try:
            data = results.finished(directory, recipe, lambda: artifacts.inputs_now(recipe))
        except Interrupted:
            raise  # a signal stops the run here as anywhere
        except Exception:  # noqa: BLE001 - said by the run that follows, on every process
            data = None
    if not distributed.anywhere(data is not None):
        return None
    if data is None:  # another process's: process 0 holds the files
        return RunResult(directory, None, None, None, None, {}, finished=True)
    video = data["outputs"].get("video")
    return RunResult(directory, directory / video if video else None,
                     directory / outputs.RECORD, None, None, data, finished=True)
