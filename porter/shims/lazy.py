"""A heavy library (torch, JAX) imported where a module's code first uses it, not where
the module is imported.

Importing torch takes a second or more, JAX half of one; the commands that only read a
recipe (`porter new`, `porter plugins`, `porter --help`) need neither, yet importing
the plugins reaches modules whose functions use them. Such a module writes
``torch = lazy.module("torch", __name__)`` instead of ``import torch``: the name is a
stand-in until an attribute is first asked of it, which imports the library and puts
it in the stand-in's place in that module, so later uses are plain globals.

Only this module's stand-in is deferred: ``sys.modules`` is not touched, so any other
``import torch`` imports it as always. A module that uses the library at import time
(a class body, a default value, a decorator) would import it then, as an ``import``
does: tests/cli/test_fresh_process.py holds the light commands' import set.
"""

from __future__ import annotations

import importlib
import sys
import threading

_lock = threading.Lock()


class module:  # noqa: N801 - used as `lazy.module("torch", __name__)`, like an import
    """The library ``name`` for the module ``owner`` (its ``__name__``)."""

    __slots__ = ("_name", "_owner")

    def __init__(self, name: str, owner: str):
        self._name, self._owner = name, owner

    def __getattr__(self, attr: str):
        if attr.startswith("__") or attr in self.__slots__:
            # a special name asked of the stand-in itself (a copy in the making, whose
            # slots are not set yet): no import for it
            raise AttributeError(attr)
        return getattr(self._resolve(), attr)

    def _resolve(self):
        real = importlib.import_module(self._name)
        owner = sys.modules.get(self._owner)  # absent: run without registering it
        if owner is not None:
            with _lock:  # another thread may be replacing it too: the same value
                names = vars(owner)
                for key, value in list(names.items()):
                    if value is self:
                        names[key] = real
        return real

    def __repr__(self) -> str:
        return f"<{self._name}, imported at its first use in {self._owner}>"
