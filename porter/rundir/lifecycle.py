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
