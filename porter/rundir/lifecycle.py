"""A run directory's lifecycle, for every command that writes one (``porter run``, its
batches, ``porter serve``'s jobs): what a resume needs before anything is loaded, and
the directory owned by the whole run (process 0 holds its lock, every process agrees).
A finished generation is written into it by ``porter.generate.runners.finish``, and
run into an item's folder by ``runners.run_into``."""

from __future__ import annotations

import contextlib
from pathlib import Path

from porter.errors import UsageError
from porter.rundir import outputs
from porter.runtime import distributed

#: what only Porter writes into a run's folder: the lock a run takes first, a stage's
#: record, denoising's checkpoint, a batch's summary (a batch split between processes
#: locks only its items' folders)
TRACES = (outputs.LOCK, "encode.json", "denoise.json", "progress-*.json", "batch*.json",
          f"*/{outputs.LOCK}")


def resume_problem(directory: Path, resume: bool) -> None:
    """UsageError for ``--resume`` of a directory that is not there to continue: none,
    or one no Porter run has written to (nothing of ``TRACES``: a resume would start
    over there and replace what it holds)."""
    if not resume:
        return
    hint = "--resume takes the output directory of an earlier run; to start a new run, " \
           "leave --resume out"
    if not directory.is_dir():
        raise UsageError(f"nothing to resume: {directory} does not exist"
                         if not directory.exists() else
                         f"nothing to resume: {directory} is not a directory", hint=hint)
    if not any(next(directory.glob(trace), None) for trace in TRACES):
        raise UsageError(f"nothing to resume: no Porter run has written to {directory}",
                         hint=hint + f" (output.dir={directory} writes a new run there, "
                                     "replacing the files a run writes)")


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
