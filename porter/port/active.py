"""What a port's calls run inside: every pass's call-time part (``Pass.around``), in the
table's order, with failures in model code explained. A run, ``porter verify``,
``porter bench`` and ``porter compile`` enter the same rows around the same programs;
what a pass does at call time is in its row, not here."""

from __future__ import annotations

import contextlib

from porter.port import passes
from porter.shims import tracing
from porter.transforms import CALL, Calling


@contextlib.contextmanager
def entered(c: Calling):
    """Each pass's ``around`` for ``c`` at its scope (``CALL``: around a call of the
    port's components, model failures explained; ``STEP``: around a transformer's calls
    inside one), in the table's order; undone in reverse, even on error."""
    with contextlib.ExitStack() as stack:
        if c.scope == CALL:
            stack.enter_context(tracing.explained())
        for row in passes.PASSES:
            context = row.around(c) if row.around is not None else None
            if context is not None:
                stack.enter_context(context)
        yield


@contextlib.contextmanager
def transformer_calls(c: Calling):
    """Both scopes, for calling a transformer by itself (``porter verify``, ``porter
    bench``, ``Port.as_torch``, a compiled transformer program): the call's, then a
    transformer's outside any denoising step."""
    with entered(c), entered(c.at_step()):
        yield
