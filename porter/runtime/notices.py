"""What Porter tells its user on stderr: status lines (what is being done) and
warnings, printed once and kept for the run record.

Python's ``warnings`` are silenced by the CLI (library chatter); what Porter
itself must tell a user (a cache it stopped using, a stored program it threw
away) goes through here instead, so it is seen and recorded.
"""

from __future__ import annotations

import sys

from porter.runtime import distributed

_given: list[str] = []


def warn(message: str, hint: str | None = None) -> None:
    """Print ``message`` once per process (a repeat is dropped)."""
    if message in _given:
        return
    _given.append(message)
    text = f"porter: {distributed.label()}warning: {message}"
    if hint:
        text += f"\n  hint: {hint}"
    print(text, file=sys.stderr, flush=True)


def given() -> list[str]:
    """Every warning given so far in this process, in order."""
    return list(_given)


def status(message: str) -> None:
    """A status line on stderr (what is being done), labelled with the process."""
    print(f"porter: {distributed.label()}{message}", file=sys.stderr, flush=True)


def quiet(message: str) -> None:
    """A ``status`` that says nothing (no progress shown)."""


#: the bar without tqdm's own rate: the caller's postfix says it once ("0.80 s/step")
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"


def progress_bar(total: int, initial: int, desc: str, unit: str, shown: bool):
    """A progress bar on stderr (tqdm), as a context manager that closes it: a denoising
    loop's steps, a batch's videos. Hidden unless ``shown``, and where stderr is not a
    terminal (a log file would fill with its redrawn lines; the status lines stay)."""
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr,
                disable=None if shown else True, dynamic_ncols=True, bar_format=BAR_FORMAT)
