"""JSON from users (a job's body, a line of a ``--prompts`` file) read as recipes are:
a key given twice is refused, naming it, where Python's ``json`` keeps the last one
silently ({"seed": 1, "seed": 2} would run seed 2)."""

from __future__ import annotations

import json


class DuplicateKey(ValueError):
    """An object that names one key twice."""

    def __init__(self, key: str):
        super().__init__(f"duplicate key {key!r}")
        self.key = key


def _unique(pairs: list) -> dict:
    found = {}
    for key, value in pairs:
        if key in found:
            raise DuplicateKey(key)
        found[key] = value
    return found


def loads(text: str | bytes):
    """``json.loads`` that refuses a key given twice in any object (DuplicateKey, a
    ValueError, as json's own errors are)."""
    return json.loads(text, object_pairs_hook=_unique)
