"""A recipe's checkpoint layout, read from its configuration files (no weights).

A family decides what its model is (CogVideoX 1.0 or 1.5, text- or
image-to-video; HunyuanVideo or 1.5; Wan's layouts) from the checkpoint's own
configuration, wherever it is at hand: a local diffusers directory, the
configurations a plugin ships for hub ids it knows (``official_configs``), or a
hub checkpoint already in the Hugging Face cache. ``model.variant`` only picks
the layout of a tiny model built in code (``source: tiny``).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import TYPE_CHECKING

from porter.recipe.sources import source_kind

if TYPE_CHECKING:
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe


def cached_snapshot(source: str) -> Path | None:
    """The local copy of a hub checkpoint, when the Hugging Face cache holds one."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(source, local_files_only=True))
    except Exception:  # not cached (or no such repository): nothing to read yet
        return None


def checkpoint_root(source: str) -> Path | None:
    """The directory holding the checkpoint's files: a local one, or a cached hub
    snapshot; None for a tiny model or a hub id not downloaded yet."""
    kind = source_kind(source)
    if kind == "local":
        return Path(source).expanduser()
    if kind == "hub":
        return cached_snapshot(source)
    return None


def component_config(family: ModelFamily, recipe: Recipe, component: str) -> dict | None:
    """``component``'s configuration with its class as ``_class_name``: from the
    checkpoint's files, else the plugin's official configuration for the hub id; None
    for a tiny model (its family knows its layout from ``model.variant``) or where no
    configuration is at hand (or it cannot be read: the load checks say why)."""
    source = recipe.model.source
    if source_kind(source) == "tiny":
        return None
    official = family.official_configs(source) or {}
    if component in official:
        _, cls, config = official[component]
        return {"_class_name": cls, **config}
    root = checkpoint_root(source)
    path = root / component / "config.json" if root is not None else None
    try:
        data = json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def setting(config: dict, cls, key: str):
    """``key`` from a configuration, or the default of the model class ``cls`` where the
    file leaves it out (diffusers writes every argument; hand-written configurations may
    not). ``cls`` may be the name of a diffusers class: diffusers is imported only
    then."""
    if key in config:
        return config[key]
    if isinstance(cls, str):
        import diffusers

        cls = getattr(diffusers, cls)
    parameter = inspect.signature(cls.__init__).parameters.get(key)
    return None if parameter is None else parameter.default
