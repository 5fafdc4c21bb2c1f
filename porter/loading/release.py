"""An original release's folder as ``model.source``: the family reads it (``release``),
and Porter stands a diffusers layout of configurations beside it, which the rest of
Porter reads as any diffusers folder, its weights coming from the release's own files
as ``model.transformer``, ``model.vae``, ``model.text_encoder``.

The layout holds no weights: ``model_index.json``, each component's configuration,
the scheduler's, and a link to the release's tokenizer folder. It is written once per
release folder (and again when what the family reads from it changes) under Porter's
cache directory, whole or not at all, and never inside the user's folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from porter.loading import single_file
from porter.recipe.sources import source_kind
from porter.runtime import compile_cache

if TYPE_CHECKING:
    from porter.recipe import Recipe
    from porter.registry import Registry


def resolved(recipe: Recipe, registry: Registry):
    """The recipe with an original release's folder in ``model.source`` replaced by a
    diffusers layout of it (and ``model.<component>`` by the release's files, where the
    recipe names none); any other recipe as it is."""
    source = recipe.model.source
    family = registry.families.get(recipe.model.family)
    try:
        if family is None or source_kind(source) != "local":
            return recipe
        root = Path(source).expanduser().resolve()
        if (root / "model_index.json").exists():
            return recipe
    except (OSError, RuntimeError, ValueError):  # a path the system refuses to look at:
        return recipe  # `validate` says why (porter.port.checks.path_problems)
    release = family.release(root)
    if release is None:
        return recipe
    files = {name: str(path) for name, path in release["files"].items()
             if name in single_file.COMPONENTS and not getattr(recipe.model, name)}
    model = recipe.model.model_copy(update={"source": str(layout(root, release)), **files})
    return recipe.model_copy(update={"model": model})


def layout(root: Path, release: dict) -> Path:
    """The diffusers layout of the release at ``root``, written if not there yet."""
    contents = _contents(release)
    digest = hashlib.sha256(json.dumps([str(root), contents], sort_keys=True,
                                       default=str).encode()).hexdigest()[:16]
    folder = _home() / f"{root.name}-{digest}"
    if (folder / "model_index.json").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=folder.parent))
    try:
        for relative, value in contents.items():
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(value, indent=2) + "\n")
        if release.get("tokenizer"):
            os.symlink(release["tokenizer"], staging / "tokenizer", target_is_directory=True)
        try:
            staging.rename(folder)  # whole or not at all
        except OSError:
            if not (folder / "model_index.json").exists():  # not another process's
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _home() -> Path:
    """Where layouts are kept: under Porter's cache (``PORTER_CACHE_DIR`` when set, as
    for compiled programs; else ``~/.cache/porter``)."""
    return compile_cache.porter_home("releases")


def _tokenizer_class(folder: Path) -> str:
    """The tokenizer's class, as its folder names it (diffusers loads a component by
    its class, not through AutoTokenizer)."""
    try:
        named = json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        named = None
    return named or "T5TokenizerFast"  # what google/umt5-xxl holds files for


def _contents(release: dict) -> dict[str, dict]:
    """relative path -> JSON of every configuration file of the layout."""
    import diffusers  # lazy: its version goes into the configurations

    index = {"_class_name": release["pipeline"], "_diffusers_version": diffusers.__version__}
    contents = {}
    for name, (library, cls, config) in release["configs"].items():
        index[name] = [library, cls]
        if library == "transformers":
            import transformers  # lazy: only for a transformers component

            config_class = getattr(transformers, cls).config_class
            contents[f"{name}/config.json"] = config_class(**config).to_dict()
        else:
            contents[f"{name}/config.json"] = {"_class_name": cls, **config}
    scheduler, settings = release["scheduler"]
    index["scheduler"] = ["diffusers", scheduler]
    contents["scheduler/scheduler_config.json"] = {"_class_name": scheduler, **settings}
    if release.get("tokenizer"):
        index["tokenizer"] = ["transformers", _tokenizer_class(Path(release["tokenizer"]))]
    contents["model_index.json"] = index
    return contents
