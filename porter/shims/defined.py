"""Whether a module defines a name, read from its source file, not imported.

Checking a patch's target (``porter validate``, ``porter patches``) by importing its
module costs seconds (a diffusers model module imports torch, transformers and peft)
where reading the file costs milliseconds. The read answers only what the source
states outright: a class, function or assignment at the module's top level and,
for ``Class.attr``, a method or assignment in that class's own body. Anything else
(an inherited method, a name defined under a condition, made at run time or deleted
later, a private ``__name`` Python renames, a file that does not parse, a module with
no source file) gets ``None``: the caller imports and looks. A class decorator is
trusted to return the class it is given, as every library's does.

Read, not run: a module that exists but fails to import is found here, and the run
that imports it says why.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import sys
from pathlib import Path

_DEFINES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def defined(module: str, path: str) -> bool | None:
    """True when ``module``'s source defines ``path`` (``name`` or ``Class.attr``)
    unconditionally; None when reading cannot tell, or when the module is imported
    already (looking at it costs nothing then: ``Patch.locate``)."""
    if module in sys.modules:
        return None
    source = _source_file(module)
    body = _parsed(source) if source is not None else None
    if body is None:
        return None
    for part in path.split("."):
        if part.startswith("__") and not part.endswith("__"):
            return None  # Python stores it as _Class__name
        node = _top_level(body, part)
        if node is None:
            return None
        body = node.body if isinstance(node, ast.ClassDef) else []
    return True


def _source_file(module: str) -> Path | None:
    """The ``.py`` file of ``module``, found from its top-level package's location
    without importing any package on the way (their ``__init__`` would run)."""
    top, *rest = module.split(".")
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: nothing is run
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    if not rest:
        return Path(spec.origin) if spec.origin.endswith(".py") else None
    if not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]).joinpath(*rest[:-1])
    for candidate in (folder / rest[-1] / "__init__.py", folder / f"{rest[-1]}.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.lru_cache(maxsize=32)
def _parsed(source: Path) -> list[ast.stmt] | None:
    """The file's top-level statements; None for one that cannot be read or parsed
    (the import then says what is wrong with it)."""
    try:
        return ast.parse(source.read_bytes(), filename=str(source)).body
    except (OSError, SyntaxError, ValueError):  # ValueError: null bytes, bad encoding
        return None


def _top_level(body: list[ast.stmt], name: str):
    """The last statement of ``body`` (none nested in a condition) that defines
    ``name``: a def, a class, an assignment with a value or an import; None if none
    does, or if a ``del`` of it follows."""
    found = None
    for node in body:
        if isinstance(node, _DEFINES) and node.name == name:
            found = node
        elif isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                found = node
        elif isinstance(node, ast.AnnAssign):  # `x: int` alone makes no attribute
            if node.value is not None and isinstance(node.target, ast.Name) \
                    and node.target.id == name:
                found = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((alias.asname or alias.name.split(".")[0]) == name
                   for alias in node.names):
                found = node
        elif isinstance(node, ast.Delete):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                found = None
    return found
