"""Ctrl-C and kill during a run: stop at a step boundary, with the work kept.

SIGTERM (what ``kill`` and job schedulers send) becomes an exception like
Ctrl-C, so cleanup runs. During denoising both are deferred to the end of the
current step, where the latents and scheduler state are consistent and can be
saved; a second Ctrl-C stops at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading

from porter.errors import Interrupted
from porter.runtime import distributed


_received: int | None = None  # the last SIGINT/SIGTERM this process itself was sent


def received() -> int | None:
    """The signal this process was sent, if one was (not a stop asked for by code, nor
    one agreed with another process that got it): a process of a served port tells
    its own stop from process 0's cancel by it."""
    return _received


def forget_received() -> None:
    """A run starts: a signal taken before it (after the last step's agreement) is
    not this run's."""
    global _received
    _received = None


def _raise(signum, frame):
    global _received
    _received = signum
    raise Interrupted(signum)


@contextlib.contextmanager
def terminate_raises():
    """SIGTERM raises ``Interrupted`` (the default would end the process on the spot)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


_requested: int | None = None  # a stop asked for by code (a server shutting down)


def request_stop(signum: int = signal.SIGTERM) -> None:
    """Ask the generation under way (in any thread) to stop, as the signal ``signum``
    would: before its next stage (``porter.generate.runners``) or after its current
    denoising step, which saves a checkpoint; either raises ``Interrupted``. Stays
    asked until ``clear_stop``."""
    global _requested
    _requested = signum


def requested() -> int | None:
    """The signal a ``request_stop`` stands for, if one was made."""
    return _requested


def agreed_request() -> int | None:
    """``requested()``, agreed by every process: with several this is a collective
    (each calls it at the same point of a run), so a stop one process was asked for
    (a served job cancelled on the process that takes requests) stops all of them
    there."""
    return _agreed(_requested)


def _agreed(signum: int | None) -> int | None:
    """The signal that stops the run if any process has one (a collective when there
    are several processes)."""
    if distributed.process_count() == 1:
        return signum
    import numpy as np
    from jax.experimental import multihost_utils

    every = multihost_utils.process_allgather(np.int32(signum or 0))
    return int(np.max(every)) or None


def clear_stop() -> None:
    global _requested
    _requested = None


class StopRequest:
    """Set by the first SIGINT/SIGTERM while deferred; checked between steps."""

    def __init__(self):
        self.signum: int | None = None

    def __call__(self, signum, frame):
        global _received
        _received = signum
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise Interrupted(signum)  # asked twice: stop now
        self.signum = signum

    def agreed(self) -> int | None:
        """The signal that stops the run, if any process got one. With several
        processes this is a collective (every process calls it after each step): all
        of them stop at the same step, or none does; a process stopping alone would
        leave the others waiting in the next step's collectives."""

        return _agreed(self.signum or _requested)


@contextlib.contextmanager
def deferred():
    """Within, SIGINT and SIGTERM only request a stop (see ``StopRequest``)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {s: signal.signal(s, request) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield request
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
