"""Safe YAML loading that remembers the file and line of every key.

Recipes come from anywhere (a colleague, a bug report, a download), so a
hostile one must fail with a RecipeError, quickly and in little memory:

- only plain data is built (mappings, lists, strings, numbers, booleans,
  dates): a tag such as ``!!python/object/apply`` is refused, never run;
- the file must be a regular file of at most MAX_BYTES (not /dev/zero, not a
  FIFO that blocks forever, not a directory);
- the document may not expand past MAX_NODES nodes or MAX_DEPTH levels once
  its aliases are expanded (a "billion laughs" is refused at the alias that
  would blow it up), and an alias may not contain itself;
- keys are unique within a mapping (YAML requires it; PyYAML would silently
  keep the last value);
- integers have at most MAX_INT_DIGITS digits, and a standard tag on text it
  cannot read (``!!int abc``, ``2024-13-45``) is an error at its line, not a
  Python exception.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from porter.errors import Problem, RecipeError

KeyPath = tuple[Any, ...]
Location = tuple[str, int | None]

# A recipe is a few kilobytes and a few hundred nodes, about six levels deep.
MAX_BYTES = 1_000_000
MAX_NODES = 100_000
MAX_DEPTH = 32
# Seeds and sizes need 20 digits; Python refuses int() past 4300 digits.
MAX_INT_DIGITS = 100

SYNTAX_HINT = "check indentation and quoting on that line"
# Errors a standard constructor raises on text it cannot read (``!!int abc``,
# ``!!bool maybe``, ``!!timestamp 2024-13-45``) instead of a YAMLError.
_CONSTRUCT_ERRORS = (ValueError, TypeError, KeyError, AttributeError, OverflowError,
                     IndexError)
_MERGE_TAG = "tag:yaml.org,2002:merge"


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Refused(yaml.MarkedYAMLError):
    """Well-formed YAML that a recipe may not contain (a limit, a tag, a duplicate)."""

    def __init__(self, problem: str, mark, hint: str):
        super().__init__(problem=problem, problem_mark=mark)
        self.hint = hint


class _Loader(yaml.SafeLoader):
    """SafeLoader that measures the document as its aliases would expand it."""

    def __init__(self, text: str):
        super().__init__(text)
        self._nodes = 0  # nodes composed so far, every alias expanded
        self._depth = 0  # nesting level of the node being composed
        self._open: set[str] = set()  # anchors whose node is still being composed
        self._sizes: dict[int, tuple[int, int]] = {}  # id(node) -> expanded (nodes, depth)

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open:
                raise Refused(f"alias *{event.anchor} is inside its own anchor "
                              f"&{event.anchor}", event.start_mark,
                              "a recursive structure cannot be a recipe value")
            node = super().compose_node(parent, index)
            nodes, depth = self._expanded(node)
            self._grow(nodes, depth, event.start_mark)
            return node
        self._grow(1, 1, event.start_mark)
        if event.anchor is not None:
            self._open.add(event.anchor)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._open.discard(event.anchor)

    def compose_mapping_node(self, anchor):
        node = super().compose_mapping_node(anchor)
        first: dict[tuple[str, str], yaml.Node] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE_TAG:
                continue
            seen = first.setdefault((key_node.tag, key_node.value), key_node)
            if seen is not key_node:
                raise Refused(f"duplicate key {key_node.value!r} (first on line "
                              f"{seen.start_mark.line + 1})", key_node.start_mark,
                              "YAML would silently keep only the last one; delete one")
        return node

    def _grow(self, nodes: int, depth: int, mark) -> None:
        self._nodes += nodes
        if self._nodes > MAX_NODES:
            raise Refused(f"the document expands to more than {MAX_NODES} YAML nodes",
                          mark, "is an alias expanding without bound (a 'billion "
                          "laughs')? a recipe needs a few hundred nodes")
        if self._depth + depth > MAX_DEPTH:
            raise Refused(f"values are nested more than {MAX_DEPTH} levels deep", mark,
                          "a recipe needs about six levels")

    def _expanded(self, node: yaml.Node) -> tuple[int, int]:
        """(nodes, depth) of ``node`` with its aliases expanded; linear in distinct nodes."""
        known = self._sizes.get(id(node))
        if known is not None:
            return known
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            children = []
        sizes = [self._expanded(child) for child in children]
        result = (1 + sum(n for n, _ in sizes), 1 + max((d for _, d in sizes), default=0))
        self._sizes[id(node)] = result
        return result

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except _CONSTRUCT_ERRORS as exc:
            text = repr(node.value) if isinstance(node, yaml.ScalarNode) else "this value"
            raise Refused(f"cannot read {_short(text)} as {node.tag.rsplit(':', 1)[-1]}: "
                          f"{_short(str(exc))}", node.start_mark,
                          "quote it to make it a string") from None

    def construct_yaml_int(self, node):
        digits = len(str(node.value).lstrip("+-").replace("_", ""))
        if digits > MAX_INT_DIGITS:
            raise Refused(f"an integer of {digits} digits is too large for a recipe",
                          node.start_mark, f"at most {MAX_INT_DIGITS} digits")
        return super().construct_yaml_int(node)

    def construct_undefined(self, node):
        raise Refused(f"YAML tag {node.tag!r} is not allowed in a recipe", node.start_mark,
                      "recipes are plain data (mappings, lists, strings, numbers, "
                      "booleans); tags that build objects are refused, never run")


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor(None, _Loader.construct_undefined)
# YAML 1.1 (PyYAML's) reads a float only with a dot: 1e-6 would be the string '1e-6',
# refused where a number is expected, though Porter prints tolerances that way and
# YAML 1.2, JSON and Python all read it as a number
_Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                              re.compile(r"^[-+]?(?:[0-9][0-9_]*\.?[0-9_]*|\.[0-9][0-9_]*)"
                                         r"[eE][-+]?[0-9]+$"),
                              list("-+0123456789."))


def _locate(node: yaml.Node, file: str, path: KeyPath, out: dict[KeyPath, Location],
            seen: set[int]) -> None:
    if id(node) in seen:  # an alias: its keys were located where it was defined
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node)
            out[path + (key,)] = (file, key_node.start_mark.line + 1)
            _locate(value_node, file, path + (key,), out, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            out[path + (index,)] = (file, item.start_mark.line + 1)
            _locate(item, file, path + (index,), out, seen)


def _refuse_file(file: str, message: str, hint: str | None = None) -> RecipeError:
    return RecipeError([Problem("", message, file=file, hint=hint)])


def _check_kind(mode: int, size: int, file: str, what: str,
                limit: int = MAX_BYTES) -> None:
    named = what if what.endswith(" file") else f"{what} file"
    if stat.S_ISDIR(mode):
        raise _refuse_file(file, f"is a directory, not a {named}",
                           "name a .yaml file inside it")
    if not stat.S_ISREG(mode):  # /dev/zero never ends, a FIFO blocks until written
        raise _refuse_file(file, "is not a regular file (a device, pipe or socket)",
                           "a recipe, and what it extends, must be a YAML file")
    if size > limit:
        raise _refuse_file(file, f"is {size} bytes; a {what} is at most {limit}",
                           "is this the right file?")


def read_text(path: Path, what: str = "recipe", limit: int = MAX_BYTES) -> str:
    """The text of a recipe file: a regular file of at most ``limit`` bytes, UTF-8.
    Other input files Porter reads whole (``what``: "prompts file") take the same
    checks with their own limit; the RecipeError's hints are a recipe's, for their
    caller to replace."""
    file = str(path)
    named = what if what.endswith(" file") else f"{what} file"
    try:
        info = os.stat(path)
        _check_kind(info.st_mode, info.st_size, file, what, limit)
        # O_NONBLOCK: if the file was swapped for a FIFO since the stat, open
        # returns at once and the fstat below refuses it.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            _check_kind(info.st_mode, info.st_size, file, what, limit)
            data = handle.read(limit + 1)  # it may have grown since the stat
        _check_kind(stat.S_IFREG, len(data), file, what, limit)
        return data.decode("utf-8")
    except FileNotFoundError:
        raise _refuse_file(file, f"{named} not found", _missing_hint(Path(path))) from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path, or not UTF-8
        raise _refuse_file(file, f"cannot read {what}: {exc}") from None


#: the recipes Porter ships (its checkout's recipes/)
SHIPPED = Path(__file__).resolve().parents[2] / "recipes"


def _missing_hint(path: Path) -> str:
    """Where a recipe that is not there may be: a near name beside where it was looked
    for, or among Porter's own recipes (a path relative to Porter's checkout, given
    from elsewhere)."""
    for place in (path.parent, SHIPPED):
        names = [p.name for p in place.glob("*.y*ml")] if place.is_dir() else []
        near = difflib.get_close_matches(path.name, names, n=1, cutoff=0.75)
        if near:
            return f"did you mean {place / near[0]}?"
    return "check the path" + (f"; Porter's own recipes are in {SHIPPED}"
                               if SHIPPED.is_dir() else "")


def _syntax_error(exc: yaml.YAMLError, file: str, text: str) -> RecipeError:
    if isinstance(exc, yaml.reader.ReaderError):  # raised before parsing: no mark
        line = text.count("\n", 0, exc.position) + 1
        return RecipeError([Problem("", f"character U+{exc.character:04X} is not allowed "
                                        "in YAML", file=file, line=line,
                                    hint="a recipe is plain text; remove it")])
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line = mark.line + 1 if mark else None
    reason = getattr(exc, "problem", None) or str(exc)
    opened = _opened(exc)
    if opened is not None and line is not None and opened.line + 1 != line:
        what = _OPENERS[next(k for k in _OPENERS if k in exc.context)]
        if "end of stream" in reason:  # found only where the text ends: mend the opening
            reason, line = f"the {what} opened here is never closed", opened.line + 1
        else:  # a missing comma, a stray colon: where YAML stopped, and what it was in
            reason = f"{reason} (inside the {what} opened on line {opened.line + 1})"
    if isinstance(exc, Refused):
        return RecipeError([Problem("", reason, file=file, line=line, hint=exc.hint)])
    return RecipeError([Problem("", f"YAML syntax error: {reason}", file=file, line=line,
                                hint=SYNTAX_HINT)])


#: what YAML's context names, as a user wrote it
_OPENERS = {"quoted scalar": "quoted string", "flow sequence": "[ list",
            "flow mapping": "{ mapping"}


def _opened(exc: yaml.YAMLError):
    """Where the quote or bracket ``exc`` was inside of was opened, else None (a block
    mapping's context is where the mapping starts, not what to mend)."""
    context = getattr(exc, "context", None) or ""
    return getattr(exc, "context_mark", None) if any(k in context for k in _OPENERS) \
        else None


def _parse(text: str, file: str) -> tuple[Any, dict[KeyPath, Location]]:
    loader = _Loader(text)  # may raise already: it checks every character
    try:
        node = loader.get_single_node()
        locations: dict[KeyPath, Location] = {(): (file, 1)}
        if node is None:
            return {}, locations
        _locate(node, file, (), locations, set())
        return loader.construct_document(node), locations
    finally:
        loader.dispose()


def load_mapping(path: Path) -> tuple[dict, dict[KeyPath, Location]]:
    """Read a YAML file whose top level is a mapping; return it and key locations."""
    file = str(path)
    text = read_text(path)
    try:
        data, locations = _parse(text, file)
    except yaml.YAMLError as exc:
        raise _syntax_error(exc, file, text) from None
    if not isinstance(data, dict):
        raise RecipeError([Problem("", f"expected a mapping at the top level, got "
                                       f"{type(data).__name__}", file=file, line=1,
                                   hint="a recipe is key: value pairs such as 'model:'")])
    return data, locations


def parse_value(text: str) -> Any:
    """One YAML value (a command-line override), under the same rules as a file.

    Raises ``Refused`` for what a recipe may not contain and another
    ``yaml.YAMLError`` for text that is not YAML at all.
    """
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
