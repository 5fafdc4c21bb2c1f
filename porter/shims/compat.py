"""Make torchax importable on torch releases that removed named-dimension overloads.

torchax 0.0.13 names ATen overloads such as ``aten.prod.dim_Dimname`` in its
tables at import time; torch 2.13 removed those overloads, so ``import torchax``
raises AttributeError. The tables only map overloads to implementations, so an
overload that no longer exists can never be dispatched to: standing in an inert
placeholder for it is exact. We do that only while importing torchax, only
after a plain import failed for this reason, and never edit installed files.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from types import ModuleType

# torchax imports these lazily (when the first Environment is built); they hold
# the same kind of tables, so they are imported under the same protection.
TORCHAX_MODULES = (
    "torchax",
    "torchax.decompositions",
    "torchax.ops.jaten",
    "torchax.ops.jtorch",
    "torchax.ops.jc10d",
    "torchax.ops.jtorchvision_nms",
)

#: Names of overloads replaced by placeholders during the last tolerant import.
replaced_overloads: list[str] = []


class RemovedOverload:
    """Placeholder for an overload this torch no longer has; hashable, never called."""

    def __init__(self, packet: str, name: str):
        self.qualname = f"{packet}.{name}"

    def __repr__(self) -> str:
        return f"<overload {self.qualname} removed from this torch>"

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.qualname} does not exist in this torch")


def is_named_dim_overload(name: str) -> bool:
    lowered = name.lower()
    return "dimname" in lowered or lowered.startswith("names") or "_names" in lowered


def _is_removed_overload_error(exc: BaseException) -> bool:
    return isinstance(exc, AttributeError) and "has no overload name" in str(exc)


@contextlib.contextmanager
def tolerate_removed_overloads():
    """While active, a missing named-dimension overload yields a placeholder."""
    from torch._ops import OpOverloadPacket

    original = OpOverloadPacket.__getattr__

    def getattr_tolerant(self, key):
        try:
            return original(self, key)
        except AttributeError:
            if not is_named_dim_overload(key):
                raise
            placeholder = RemovedOverload(str(self), key)
            replaced_overloads.append(placeholder.qualname)
            return placeholder

    OpOverloadPacket.__getattr__ = getattr_tolerant
    try:
        yield
    finally:
        OpOverloadPacket.__getattr__ = original


def _forget(package: str) -> None:
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
        del sys.modules[name]


def import_tolerant(modules: tuple[str, ...]) -> ModuleType:
    """Import ``modules`` (first is returned); retry tolerantly only if needed."""
    try:
        for name in modules:
            importlib.import_module(name)
        return sys.modules[modules[0]]
    except AttributeError as exc:
        if not _is_removed_overload_error(exc):
            raise
    _forget(modules[0].split(".")[0])
    replaced_overloads.clear()
    with tolerate_removed_overloads():
        for name in modules:
            importlib.import_module(name)
    return sys.modules[modules[0]]


def import_torchax() -> ModuleType:
    """``import torchax`` that works on torch 2.13+ and is a plain import elsewhere."""
    return import_tolerant(TORCHAX_MODULES)


def import_module(name: str) -> ModuleType:
    """``importlib.import_module`` that takes torchax (and its submodules) through
    ``import_torchax``: a plain import of them fails on torch 2.13."""
    if name.split(".")[0] == "torchax":
        import_torchax()
    return importlib.import_module(name)
