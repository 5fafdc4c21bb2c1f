"""Where a recipe's model comes from: ``model.source`` is 'tiny' (built in code), a
local diffusers directory, or a Hugging Face hub id."""

from __future__ import annotations

import re
from pathlib import Path

TINY = "tiny"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def source_kind(source: str) -> str:
    """'tiny', 'local' (an existing directory), 'hub' (org/name) or 'missing'."""
    if source == TINY:
        return "tiny"
    if Path(source).expanduser().exists():
        return "local"
    if HUB_ID.match(source) and not source.startswith((".", "/", "~")):
        return "hub"
    return "missing"
