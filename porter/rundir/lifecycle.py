"""A run directory's lifecycle, for every command that writes one (``porter run``, its
batches, ``porter serve``'s jobs): what a resume needs before anything is loaded, the
directory owned by the whole run (process 0 holds its lock, every process agrees), and
a finished generation written into it (its results, then the record that makes them
one complete run). Running a generation into a directory is ``porter.generate.runners.
run_into``, which uses these."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from porter.errors import UsageError
from porter.rundir import outputs, record, results
from porter.runtime import distributed

if TYPE_CHECKING:
    from porter.api import Outcome, Port
    from porter.recipe import Recipe


@dataclass
class RunResult:
    directory: Path
    video: Path | None  # None when the run stopped before decoding
    record: Path | None
    latents: object  # CPU torch tensor: the final latents (None after encode only)
    frames: object  # uint8 array (count, height, width, 3), or None
    data: dict  # the run record


def resume_problem(directory: Path, resume: bool) -> None:
    """UsageError for ``--resume`` of a directory that is not there to continue."""
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


def finish(port: Port, recipe: Recipe, outcome: Outcome, directory: Path) -> RunResult:
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
    written = results.write_results(directory, recipe, outcome.frames, outcome.latents)
    written["files"].update(outcome.stage_files)
    data = port.run_record(recipe, outcome, written)
    record_path = record.write_json(directory / outputs.RECORD, data)
    video_path = directory / written["video"] if written["video"] else None
    return RunResult(directory, video_path, record_path, outcome.latents, outcome.frames,
                     data)
