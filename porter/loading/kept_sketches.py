"""Component sketches (``porter.transforms.sketch``) kept on disk, so that checking a
model built once before (``porter validate``, ``porter plan``, a server's job checks)
needs neither torch nor the model's library.

A kept sketch is found by a key of everything its build read: the recipe's model
section (its family, source, variant, configuration and pipeline; not its dtype,
which is applied to the sketch afterwards) and which inputs it gives (an image picks
another pipeline), a local checkpoint's configuration files, and the code that built
it (the versions of torch, diffusers and transformers, with the commit of one
installed from a repository; the size and time of every source file of Porter and of
the family's plugin package, as they were when this process first asked: a server
whose files change under it keeps to the code it runs). A key that cannot be made (a
hub id Porter has no configuration for) keeps nothing. The newest ``KEPT`` sketches
are kept; older ones are removed as new ones are kept.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from porter.loading import published
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
#: the most sketch files kept (a tiny model's are about 60 KB, a 14B one's 200 KB)
KEPT = 200
#: a partial write older than this was left by a writer that died
STALE_S = 3600


def key(family: ModelFamily, recipe: Recipe) -> str | None:
    """The key of the recipe's model (see the module's docstring)."""
    model = recipe.model.model_dump(mode="json")
    parts = {"format": sketch.FORMAT, "model": {k: model.get(k) for k in MODEL_KEYS},
             "inputs": sorted(k for k in INPUTS if getattr(recipe.generate, k)),
             "code": _code(type(family).__module__)}
    kind = source_kind(recipe.model.source)
    if kind == "local":
        parts["files"] = _config_files(Path(recipe.model.source).expanduser())
    elif kind != "tiny" and family.official_configs(recipe.model.source) is None:
        shipped = published.layout(recipe.model.source)  # what the build reads then
        if shipped is None:
            return None
        parts["files"] = _config_files(shipped)
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def read(found: str) -> dict[str, sketch.Sketch] | None:
    """The sketches kept under key ``found``; None where none are (or unreadable)."""
    try:
        path = _path(found)
        data = json.loads(path.read_text())
        kept = {name: sketch.Sketch.from_json(entry) for name, entry in data.items()}
        os.utime(path)  # used: the last to go when old ones are removed
    except Exception:  # noqa: BLE001 - missing, damaged or of another shape: build again
        return None
    return kept or None  # a model of no components is no model


def keep(found: str, sketches: dict[str, sketch.Sketch]) -> None:
    """Keep ``sketches`` under key ``found``; a cache that cannot be written is passed
    over (it only saves time)."""
    try:
        _path(found).parent.mkdir(parents=True, exist_ok=True)
        atomic.write_bytes(_path(found), json.dumps(
            {name: s.to_json() for name, s in sketches.items()}).encode())
        _prune(_path(found).parent)
    except OSError:
        pass


def _prune(folder: Path) -> None:
    """The oldest sketches past ``KEPT``, and partial writes a dead writer left."""
    files = sorted(folder.glob("*.json"), key=lambda path: path.stat().st_mtime)
    stale = [p for p in folder.glob(f".*{atomic.PARTIAL}")
             if time.time() - p.stat().st_mtime > STALE_S]
    for path in files[:-KEPT] + stale:
        path.unlink(missing_ok=True)


def _path(found: str) -> Path:
    return compile_cache.porter_home("sketches") / f"{found}.json"


def _code(family_module: str) -> dict:
    """What identifies the code a build runs (each part once a process: see the
    docstring)."""
    paths = {Path(__file__).resolve().parents[1]}  # porter
    package = sys.modules.get(family_module.split(".")[0])
    if package is not None:  # the plugin's top package, or its one module
        paths.update(Path(p).resolve() for p in getattr(package, "__path__", ()))
        if not hasattr(package, "__path__") and getattr(package, "__file__", None):
            paths.add(Path(package.__file__).resolve())
    return {"versions": [_version(name) for name in LIBRARIES],
            "sources": [_stamp(path) for path in sorted(paths)]}


@functools.cache
def _version(name: str) -> list | None:
    """A library's version, where it was installed from (a repository's commit), and
    for an editable install the stamp of its sources (its version stays as they
    change)."""
    try:
        found = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    origin = found.read_text("direct_url.json") or ""
    editable = json.loads(origin).get("dir_info", {}).get("editable") if origin else False
    spec = importlib.util.find_spec(name) if editable else None  # nothing is run
    local = _stamp(Path(spec.origin).parent) if spec and spec.origin else None
    return [found.version, origin, local]


@functools.cache
def _stamp(folder: Path) -> str:
    """A digest of the name, size and time of every Python file under ``folder`` (or
    of the one file ``folder`` is)."""
    digest = hashlib.sha256(str(folder).encode())
    if folder.is_file():
        info = folder.stat()
        digest.update(f"{info.st_size}:{info.st_mtime_ns}".encode())
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
