"""An attribute replaced for a block and put back after, whatever happens: a patch's
target (``porter.shims.patch``), a pipeline's method while Porter watches a call
(``porter.families.chunked``)."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def replaced(owner, attr: str, value):
    """``owner.attr`` is ``value`` for the block, then what it was, even on error. The
    owner's own attribute is kept raw (on a class, staticmethod/classmethod stay
    intact) and one it inherits (a class's base's, an object's class's method) is
    removed again, so that one shows through as before."""
    own = vars(owner).get(attr, _MISSING) if hasattr(owner, "__dict__") \
        else getattr(owner, attr)
    setattr(owner, attr, value)
    try:
        yield
    finally:
        if own is _MISSING:
            delattr(owner, attr)
        else:
            setattr(owner, attr, own)


_MISSING = object()
