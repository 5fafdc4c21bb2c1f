"""Component sketches (``porter.transforms.sketch``) kept on disk, so that checking a
model built once before (``porter validate``, ``porter plan``, a server's job checks)
needs neither torch nor the model's library.

A kept sketch is found by a key of everything its build read: the recipe's model
section (its family, source, variant, configuration and pipeline; not its dtype,
which is applied to the sketch afterwards) and which inputs it gives (an image picks
another pipeline), a local checkpoint's configuration files, and the code that built
it (the versions of torch, diffusers and transformers; the size and time of every
source file of Porter and of the family's plugin). A key that cannot be made (a hub
id Porter has no configuration for) keeps nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from porter.recipe.inputs import INPUTS
from porter.recipe.modular import INDEX
from porter.recipe.sources import source_kind
from porter.runtime import atomic, compile_cache
from porter.transforms import sketch

if TYPE_CHECKING:
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe

#: the model section's keys a build reads
MODEL_KEYS = ("family", "source", "variant", "config", "pipeline")
LIBRARIES = ("torch", "diffusers", "transformers")
#: a checkpoint's files that decide its modules' shapes
CONFIG_FILES = ("model_index.json", INDEX, "config.json")


def key(family: ModelFamily, recipe: Recipe, shipped: Path | None = None) -> str | None:
    """The key of the recipe's model (see the module's docstring); ``shipped``: the
    layout Porter ships for a hub id, where the build reads it."""
    model = recipe.model.model_dump(mode="json")
    parts = {"format": sketch.FORMAT, "model": {k: model.get(k) for k in MODEL_KEYS},
             "inputs": sorted(k for k in INPUTS if getattr(recipe.generate, k)),
             "code": _code(family)}
    kind = source_kind(recipe.model.source)
    if kind == "local":
        parts["files"] = _config_files(Path(recipe.model.source).expanduser())
    elif kind != "tiny":
        if shipped is None and family.official_configs(recipe.model.source) is None:
            return None
        parts["files"] = _config_files(shipped) if shipped is not None else None
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def read(found: str) -> dict[str, sketch.Sketch] | None:
    """The sketches kept under key ``found``; None where none are (or unreadable)."""
    try:
        data = json.loads(_path(found).read_text())
        return {name: sketch.Sketch.from_json(entry) for name, entry in data.items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def keep(found: str, sketches: dict[str, sketch.Sketch]) -> None:
    """Keep ``sketches`` under key ``found``; a cache that cannot be written is passed
    over (it only saves time)."""
    try:
        _path(found).parent.mkdir(parents=True, exist_ok=True)
        atomic.write_bytes(_path(found), json.dumps(
            {name: s.to_json() for name, s in sketches.items()}).encode())
    except OSError:
        pass


def _path(found: str) -> Path:
    return compile_cache.porter_home("sketches") / f"{found}.json"


def _code(family: ModelFamily) -> dict:
    """What identifies the code a build runs."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    folders = {Path(__file__).resolve().parents[1]}  # porter
    owner = sys.modules.get(type(family).__module__)
    if owner is not None and getattr(owner, "__file__", None):
        folders.add(Path(owner.__file__).resolve().parent)
    return {"versions": versions, "sources": [_stamp(folder) for folder in sorted(folders)]}


def _stamp(folder: Path) -> str:
    """A digest of the name, size and time of every Python file under ``folder``."""
    digest = hashlib.sha256(str(folder).encode())
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                info = os.stat(os.path.join(root, name))
                digest.update(f"{root}/{name}:{info.st_size}:{info.st_mtime_ns}".encode())
    return digest.hexdigest()


def _config_files(root: Path) -> dict[str, str]:
    """Each configuration file of a checkpoint (its index, each component's
    config.json) by relative path -> a digest of its bytes."""
    found = {}
    for path in [root / name for name in CONFIG_FILES[:2]] + sorted(root.glob("*/config.json")):
        try:
            found[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            continue
    return found
