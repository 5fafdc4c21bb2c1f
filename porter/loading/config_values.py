"""A checkpoint's configuration values against what its model classes take.

A ``config.json`` goes verbatim to the model's constructor. Nonsense there
(``num_layers: -3``, a string where a number belongs) either fails deep in
the constructor or, worse, builds a model that fails later, mid-run. Each
value is compared with the constructor's default for the same argument: no
string or bool where a number belongs, no number where a string or a flag
does, and no negative number where the default is a non-negative integer
(counts and sizes). Arguments without a default, or with None, say nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from porter.errors import kind_of
from porter.loading import abstract
from porter.transforms.sketch import signature_defaults


def _fits(value, default) -> str | None:
    """Why ``value`` cannot stand where ``default`` does (None: it can). Only plain
    nonsense: many arguments take an integer or a list (``sample_size``) and a
    count may be 0, so those pass."""
    want, got = kind_of(default), kind_of(value)
    if value is None:
        return None
    wrong = {"an integer": ("a string", "a bool", "a mapping"),
             "a number": ("a string", "a bool", "a mapping"),
             "a bool": ("a string", "a number", "a list", "a mapping"),
             "a string": ("an integer", "a number", "a bool")}.get(want, ())
    if got in wrong:
        return f"{got} where {want} belongs (default {default!r})"
    if want == "an integer" and got == "an integer" and default >= 0 > value:
        return f"a negative count or size (default {default!r})"
    return None


def value_problems(config: dict, defaults: dict) -> list[tuple[str, str]]:
    """(key, 'VALUE is why') for each value of ``config`` that cannot be right for a
    model class whose ``signature_defaults`` are ``defaults``."""
    found = []
    for key, value in config.items():
        why = _fits(value, defaults[key]) if key in defaults else None
        if why:
            found.append((key, f"{value!r} is {why}"))
    return found


def problems(root: Path) -> list[str]:
    """'component/config.json: key: why' for each value that cannot be right."""

    found = []
    for name, (library, cls) in abstract.module_classes(root).items():
        path = root / name / "config.json"
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # the checkpoint check names a missing or unreadable config
        if not isinstance(config, dict):
            found.append(f"{name}/config.json: not a JSON object")
            continue
        found += [f"{name}/config.json: {key}: {why}"
                  for key, why in value_problems(config, signature_defaults(library, cls))]
    return found
