"""Safe YAML loading that remembers the file and line of every key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from porter.errors import Problem, RecipeError

KeyPath = tuple[Any, ...]
Location = tuple[str, int | None]

# A recipe is a few hundred nodes; this bounds alias-expansion tricks.
MAX_NODES = 100_000


def _locate(node: yaml.Node, file: str, path: KeyPath, out: dict[KeyPath, Location],
            seen: set[int]) -> None:
    if id(node) in seen:  # an alias: its keys were located where it was defined
        return
    seen.add(id(node))
    if len(seen) > MAX_NODES:
        raise RecipeError([Problem("", f"more than {MAX_NODES} YAML nodes", file=file,
                                   hint="is an alias expanding without bound?")])
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node)
            out[path + (key,)] = (file, key_node.start_mark.line + 1)
            _locate(value_node, file, path + (key,), out, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            out[path + (index,)] = (file, item.start_mark.line + 1)
            _locate(item, file, path + (index,), out, seen)


def load_mapping(path: Path) -> tuple[dict, dict[KeyPath, Location]]:
    """Read a YAML file whose top level is a mapping; return it and key locations."""
    file = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError([Problem("", "recipe file not found", file=file,
                                   hint="check the path; recipes live in recipes/")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError([Problem("", f"cannot read recipe: {exc}", file=file)]) from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        locations: dict[KeyPath, Location] = {(): (file, 1)}
        if node is not None:
            _locate(node, file, (), locations, set())
        data = loader.construct_document(node) if node is not None else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark else None
        reason = getattr(exc, "problem", None) or str(exc)
        raise RecipeError([Problem("", f"YAML syntax error: {reason}", file=file, line=line,
                                   hint="check indentation and quoting on that line")]) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise RecipeError([Problem("", f"expected a mapping at the top level, got "
                                       f"{type(data).__name__}", file=file, line=1,
                                   hint="a recipe is key: value pairs such as 'model:'")])
    return data, locations
