"""diffusers' model packages import a model when it is asked for, and every model module
is imported with real tensors.

``diffusers.models.transformers``, ``.autoencoders``, ``.unets`` and ``.controlnets``
import every model they hold when they are first imported (some 150 modules, a second
or more: a Wan run paid for HunyuanVideo's, Cosmos', the UNets'), though a run uses
two or three. Once ``install``ed (``import porter`` does), those packages import nothing
up front: a name asked of one (``from diffusers.models.autoencoders import
AutoencoderKLWan``, diffusers' own lazy top-level names, an attribute) imports the one
module that defines it, as the package's ``__init__`` says (read, not run), and a
submodule's name its submodule.

A module imported for the first time under ``torch.device("meta")`` (a checked or
abstract build) would make its module-level tensors there for the rest of the process
(diffusers' Cosmos VAE keeps its wavelets in one), and a later real load would find
them without values: a module of diffusers imported while the meta device is current is
executed with the CPU as torch's default device.

What diffusers imports up front for a rare path (``DEFERRED``: SciPy's statistics, which
fourteen schedulers import for their beta sigmas, and with them the model classes'
single-file loader; its integration, the LMS scheduler's) is executed when first used: the module is there at once, with its
spec and path, and its code runs at the first name asked of it that it lacks.

The finder asks the finders after it where a module is (another import hook, an
editable install, a zip) and wraps what they find; a package with no source to read
(compiled files alone) runs its own ``__init__``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import pkgutil
import sys
import threading

ROOT = "diffusers."

#: the packages whose ``__init__`` imports every model they hold
PACKAGES = frozenset(f"{ROOT}models.{name}" for name in ("transformers", "autoencoders",
                                                         "unets", "controlnets"))
#: modules executed at their first use, not their import (0.5-1 s for SciPy's
#: statistics, which a run needs only for a scheduler's beta sigmas, and its
#: integration, for the LMS scheduler's coefficients)
DEFERRED = frozenset({"scipy.stats", "scipy.integrate"})


def install() -> None:
    """The finder first on ``sys.meta_path``, once. Modules imported before keep what
    they are (an eager package stays eager)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def defined_names(source: str) -> dict[str, tuple[str, str]]:
    """A package ``__init__``'s names -> (the submodule, the name there) each comes
    from, for every ``from .module import name [as alias]`` in it (under any
    condition: those it guards import what they need themselves)."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for alias in node.names:
                if alias.name != "*":
                    found[alias.asname or alias.name] = (node.module, alias.name)
    return found


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith(ROOT) and fullname not in DEFERRED:
            return None
        spec = _found_after(self, fullname, path, target)
        if spec is None or spec.loader is None or isinstance(spec.loader, _Wrapped):
            return spec  # nowhere, a namespace package, or wrapped already
        kind = _Deferred if fullname in DEFERRED \
            else _LazyPackage if fullname in PACKAGES else _RealTensors
        spec.loader = kind(spec.loader)
        return spec


def _found_after(finder, fullname, path, target):
    """The spec the finders after ``finder`` on ``sys.meta_path`` find."""
    finders = sys.meta_path
    after = finders[finders.index(finder) + 1:] if finder in finders else finders
    for other in after:
        find = getattr(other, "find_spec", None)
        spec = find(fullname, path, target) if find is not None else None
        if spec is not None:
            return spec
    return None


class _Wrapped(importlib.abc.Loader):
    """A loader standing in for ``real``: what it does not do itself, ``real`` does
    (its source, its resources)."""

    def __init__(self, real):
        self.real = real

    def create_module(self, spec):
        return self.real.create_module(spec)

    def __getattr__(self, name):
        if name == "real":  # not set yet (a copy being made): no loader to ask
            raise AttributeError(name)
        return getattr(self.real, name)


class _Deferred(_Wrapped):
    """The module's code run at the first name asked of it that it lacks (a module's
    ``__getattr__``), not at its import. Its spec, name and path are set at once, so
    a second ``import`` of it runs nothing (``importlib.util.LazyLoader``'s module runs
    at any attribute, the import system's own look at ``__spec__`` included). Until
    then ``dir()`` shows only those."""

    def exec_module(self, module):
        lock, running = threading.RLock(), []

        def __getattr__(name):
            with lock:  # one thread runs it; another asking meanwhile waits
                if running:  # its own code, asking a name it has not defined yet
                    raise AttributeError(f"module {module.__name__!r} has no attribute "
                                         f"{name!r}")
                if vars(module).get("__getattr__") is __getattr__:
                    running.append(True)
                    try:  # a failure leaves this hook, so the next name raises it again
                        self.real.exec_module(module)
                    finally:
                        running.clear()
                    if vars(module).get("__getattr__") is __getattr__:
                        del module.__getattr__  # (or the module's own replaced it)
            return getattr(module, name)

        module.__getattr__ = __getattr__


class _RealTensors(_Wrapped):
    def exec_module(self, module):
        import torch

        # only where the meta device is current: a device context around every import
        # made the tests that import diffusers' modules inside a port 40% slower
        if torch.get_default_device().type != "meta":
            return self.real.exec_module(module)
        with torch.device("cpu"):
            self.real.exec_module(module)


class _LazyPackage(_RealTensors):
    def exec_module(self, module):
        getter = getattr(self.real, "get_source", None)
        source = getter(module.__name__) if getter is not None else None
        if source is None:  # nothing to read: the package as it is written
            return super().exec_module(module)
        names = defined_names(source)
        package = module.__name__
        # its submodules, listed once: a name that is neither is answered at once (a
        # search of the path for every miss made each hasattr a file-system walk)
        submodules = {info.name for info in pkgutil.iter_modules(module.__path__)}

        def __getattr__(name):
            if name in names:
                submodule, defined = names[name]
                value = getattr(importlib.import_module(f".{submodule}", package), defined)
            elif name in submodules:  # a submodule as an attribute, as the eager package
                value = importlib.import_module(f".{name}", package)
            else:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            setattr(module, name, value)
            return value

        module.__getattr__ = __getattr__
        module.__dir__ = lambda: sorted({*vars(module), *names})
