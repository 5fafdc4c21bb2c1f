"""Every piece of state that changes what a traced program is or what is counted while
it is traced: the one place such state lives (``tests/runtime/test_trace_context.py``
fails on a ``ContextVar`` anywhere else).

Each ``State`` says whether it keys a compiled program (``keys_programs``): a program
traced under another value of it is another program, so the compile pass's programs
(``porter.transforms.jit.autosplit``) and the trace cache's keys (``porter.transforms.
jit.traces``) are made from ``key()``, not from a list each of them keeps. A state that
only counts what is traced (attention's FLOPs) keys nothing. This is how JAX keeps its
own configuration (``jax/_src/config.py``: states marked ``include_in_jit_key``,
gathered by ``trace_context()``).

A new state is declared here, with its default, its doc and whether it keys programs;
code sets it with ``State.set`` (a context manager) and reads it with ``State.get``.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, eq=False)
class State:
    """One piece of tracing state, held per thread and per task (a ``ContextVar``)."""

    name: str
    doc: str
    default: Any = None
    #: a program traced under another value is another program
    keys_programs: bool = False
    _var: contextvars.ContextVar = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "_var", contextvars.ContextVar(f"porter_{self.name}",
                                                                default=self.default))

    def get(self) -> Any:
        return self._var.get()

    @contextlib.contextmanager
    def set(self, value: Any):
        """``value`` for the block, then what it was, even on error."""
        token = self._var.set(value)
        try:
            yield value
        finally:
            self._var.reset(token)


ATTENTION_OFF = State(
    "attention_off", "attention runs torchax's own lowering, not the recipe's backend "
    "(a component the recipe skips: ``porter.transforms.attention.Skipped``)",
    default=False, keys_programs=True)
VIDEO_GRID = State(
    "video_grid", "the video's token grid (frames, height, width) around a transformer's "
    "calls, where the recipe windows attention (``attention.window``) and the step is "
    "not one of its dense ones; None: nothing windowed (dense attention: the programs "
    "of a port without a window). A block's program sees only the token count, which "
    "two grids may share (480x832 and 832x480)", keys_programs=True)
ATTENTION_TALLY = State(
    "attention_tally", "where attention calls traced add their FLOPs "
    "(``porter.transforms.attention.counted``); None: not counted")
ATTENTION_REPEATS = State(
    "attention_repeats", "how many times attention traced now runs per call of the "
    "program (a scan's body runs once per block; 0: traced for shapes only)", default=1)

#: every state, in the order a key lists them
STATES = (ATTENTION_OFF, VIDEO_GRID, ATTENTION_TALLY, ATTENTION_REPEATS)


def key() -> tuple:
    """What a program traced now is keyed by besides its inputs: (name, value) of each
    state that keys programs and is not at its default (empty outside every block that
    sets one, so a port without such state keys its programs as before)."""
    return tuple((state.name, state.get()) for state in STATES
                 if state.keys_programs and state.get() != state.default)


def label(found: tuple) -> str:
    """A ``key()`` as a suffix of a program's name ("" for the empty key):
    ``@attention_off=True,video_grid=21x30x52``."""
    if not found:
        return ""

    def shown(value) -> str:
        return "x".join(map(str, value)) if isinstance(value, tuple) else str(value)

    return "@" + ",".join(f"{name}={shown(value)}" for name, value in found)
