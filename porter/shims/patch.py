"""A patch: a named, documented, reversible replacement of a library's function, method
or attribute, and what plugins register to make a library traceable.

A ``Patch`` names its target by import path (``module:Attr.attr``), says which
library versions it is known to fit, and builds its replacement from the
original plus parameters. Plugins (and the core) register patches through the
``porter_register_patches`` hook (``porter.transforms.patches.Patch`` is the same
class); recipes list them by name. Patches work outside Porter too::

    from porter_wan.patches import ROPE_CACHE
    with ROPE_CACHE.applied():
        ...  # your own pipeline, patched; originals restored on exit
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

from porter.errors import UsageError
from porter.shims.attributes import replaced
from porter.shims.compat import import_module
from porter.shims.defined import defined


class PatchError(UsageError):
    """A patch cannot be applied: missing target, unknown parameter."""


@dataclass(frozen=True)
class Patch:
    name: str
    target: str  # "package.module:Class.method" or "package.module:function"
    doc: str
    replacement: Callable[..., Any]  # replacement(original, **params) -> new value
    fits: str = ""  # versions known to fit, e.g. "diffusers>=0.35,<0.43"
    params: dict[str, Any] = field(default_factory=dict)  # accepted params and defaults
    #: a function other modules import by name (``from m import f``): replaced in every
    #: loaded module that holds it too, not only where it is defined
    imported_by_name: bool = False

    def installed_fits(self) -> tuple[str, str | None, bool | None]:
        """(library, installed version, whether ``fits`` admits it); None where the
        patch names no versions or the library is not installed."""
        from importlib.metadata import PackageNotFoundError, version

        from packaging.requirements import InvalidRequirement, Requirement

        try:
            wanted = Requirement(self.fits)
        except InvalidRequirement:
            return "", None, None
        try:
            found = version(wanted.name)
        except PackageNotFoundError:
            return wanted.name, None, None
        return wanted.name, found, wanted.specifier.contains(found, prereleases=True)

    def locate(self) -> tuple[Any, str, Any]:
        """(owner, attribute name, current value); PatchError if it does not exist."""
        module_name, _, path = self.target.partition(":")
        try:
            owner = import_module(module_name)
        except ImportError as exc:
            raise PatchError(f"patch {self.name}: cannot import {module_name} ({exc})",
                             hint=f"known to fit {self.fits or 'unspecified versions'}") from None
        parts = path.split(".")
        for part in parts[:-1]:
            owner = getattr(owner, part, None)
            if owner is None:
                break
        if owner is None or not hasattr(owner, parts[-1]):
            raise PatchError(f"patch {self.name}: target {self.target} does not exist in the "
                             "installed library", hint=f"known to fit "
                             f"{self.fits or 'unspecified versions'}; check your versions")
        return owner, parts[-1], getattr(owner, parts[-1])

    def check_target(self) -> None:
        """PatchError if the target does not exist, read from its module's source where
        that tells (nothing imported: ``porter.shims.defined``), else imported. Read,
        a module that exists but fails to import passes here: applying the patch
        imports it and says why."""
        module_name, _, path = self.target.partition(":")
        if defined(module_name, path) is not True:
            self.locate()

    def check_params(self, params: dict) -> None:
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            accepted = ", ".join(sorted(self.params)) or "none"
            raise PatchError(f"patch {self.name}: unknown parameter(s) {', '.join(unknown)}",
                             hint=f"accepted: {accepted}")

    @contextlib.contextmanager
    def applied(self, **params):
        """Apply for the duration of a ``with`` block; restored even on error."""
        self.check_params(params)
        owner, attr, original = self.locate()
        value = self.replacement(original, **{**self.params, **params})
        with contextlib.ExitStack() as stack:
            for holder, name in [(owner, attr)] + (
                    _holders(original, owner, attr) if self.imported_by_name else []):
                stack.enter_context(replaced(holder, name, value))
            yield


def _holders(original, owner, attr: str) -> list[tuple[Any, str]]:
    """Every other module's name for ``original`` (imported by name), among the modules
    loaded when the patch is applied (a model module imported later keeps its own)."""
    import sys

    found = []
    for module in list(sys.modules.values()):
        names = getattr(module, "__dict__", None)
        if not isinstance(names, dict) or module is owner:
            continue
        found += [(module, name) for name, value in list(names.items())
                  if value is original]
    return found


@contextlib.contextmanager
def applied(selected: list[tuple[Patch, dict]]):
    """Apply several patches in order; undone in reverse order."""
    with contextlib.ExitStack() as stack:
        for patch, params in selected:
            stack.enter_context(patch.applied(**params))
        yield
