"""What Porter tells its user on stderr: status lines (what is being done) and
warnings, printed once and kept for the run record.

Python's ``warnings`` are silenced by the CLI (library chatter); what Porter
itself must tell a user (a cache it stopped using, a stored program it threw
away) goes through here instead, so it is seen and recorded.
"""

from __future__ import annotations

import sys
import time

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
    loop's steps, a batch's videos. Hidden unless ``shown``; where stderr is not a
    terminal (a log file, which would fill with its redrawn lines), a status line every
    ``LOG_EVERY_S`` seconds instead, so a long run's log is never silent for minutes."""
    if shown and not sys.stderr.isatty():
        return _Logged(total, initial, desc, unit)
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr,
                disable=None if shown else True, dynamic_ncols=True, bar_format=BAR_FORMAT)


#: seconds between two progress lines in a log (a bar redraws; a log only appends)
LOG_EVERY_S = 10.0


class _Logged:
    """A progress bar's calls (update, set_postfix_str) as status lines: one once
    ``LOG_EVERY_S`` have passed since the last (or since the start), none faster, and
    at the end the count reached when lines were said and steps came after the last."""

    def __init__(self, total: int, initial: int, desc: str, unit: str):
        self.total, self.n, self.desc, self.unit = total, initial, desc, unit
        self.postfix = ""
        self.last, self.said = time.monotonic(), None  # no line yet: a short loop says none

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.said is not None and self.n != self.said:  # the steps since the last line
            self._say(time.monotonic())
        return False

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= LOG_EVERY_S:
            self._say(now)

    def _say(self, now: float) -> None:
        self.last, self.said = now, self.n
        status(f"{self.desc}: {self.n}/{self.total} {self.unit}s"
               + (f" ({self.postfix})" if self.postfix else ""))
