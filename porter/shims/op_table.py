"""torchax's op table (``env._ops``: an ATen op or torch function -> its lowering),
changed for a block and put back afterwards: the one way Porter overrides torchax's
lowerings, for its own (``porter.shims.lowerings``) and for the recipe's attention
backend (``porter.transforms.attention``)."""

from __future__ import annotations

import contextlib
import dataclasses


@contextlib.contextmanager
def overridden(env, lowerings: dict, *, view_ops=frozenset(), wrapped: dict | None = None):
    """For the block, each op of ``lowerings`` runs its function (``view_ops``: those
    whose result writes through to a view's target, torchax's ``is_view_op``), and each
    op of ``wrapped`` a wrapper of torchax's own lowering (``wrapper(func)``; the
    lowering keeps its other properties; an op torchax does not lower stays as it is).
    Yields what the table held for each op before; afterwards it holds exactly that
    again (an op it did not hold is removed), even on error."""
    wrapped = wrapped or {}
    saved = {op: env._ops.get(op) for op in (*lowerings, *wrapped)}
    try:
        for op, lowering in lowerings.items():
            env.override_op_definition(op, lowering, is_view_op=op in view_ops)
        for op, wrapper in wrapped.items():
            if saved[op] is not None:
                env._ops[op] = dataclasses.replace(saved[op], func=wrapper(saved[op].func))
        yield saved
    finally:
        for op, previous in saved.items():
            if previous is None:
                env._ops.pop(op, None)
            else:
                env._ops[op] = previous
