"""Modular diffusers pipelines (``ModularPipeline``: blocks assembled at run time) built
as diffusers itself builds them, so every other pass treats them as any pipeline.

A modular pipeline is created from its class and a checkpoint directory (its
``modular_model_index.json``, or a classic ``model_index.json``, which diffusers maps
onto the blocks); its components are then loaded by diffusers' ``load_components``,
except those Porter built empty to read straight into their shards, which are handed
over with ``update_components``. diffusers logs a component it fails to load and goes
on; here that is an error, named."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

from porter.recipe.modular import INDEX


def index_entries(root: Path) -> dict[str, tuple[str, str]] | None:
    """Component -> (library, class) of a modular checkpoint's index, for the components
    whose files lie under ``root`` (as save_pretrained writes them); None when ``root``
    holds no modular index. A component whose spec points at another repository is
    left to diffusers to load."""
    path = root / INDEX
    if not path.is_file():
        return None
    index = json.loads(path.read_text())
    found = {}
    for name, entry in index.items():
        if name.startswith("_") or not (isinstance(entry, list) and len(entry) == 3):
            continue
        library, class_name, spec = entry
        subfolder = spec.get("subfolder") if isinstance(spec, dict) else None
        if subfolder in (None, name) and (root / name).is_dir():
            found[name] = (library, class_name)
    return found


def load(cls, root: Path, dtype, built: dict):
    """The modular pipeline ``cls`` from ``root``: ``built`` components (already made,
    e.g. empty ones read at placement) as given, the rest loaded by diffusers in
    ``dtype`` (one dtype, or a dict with a ``default``): those the checkpoint's index
    names. OSError naming a component diffusers could not load."""
    pipe = cls(pretrained_model_name_or_path=str(root))
    if built:
        pipe.update_components(**built)
    wanted = [name for name in listed(root) if name in pipe.pretrained_component_names
              and name not in built and getattr(pipe, name, None) is None]
    with _failures() as failed:
        pipe.load_components(names=wanted, torch_dtype=dtype)
    missing = [name for name in wanted if getattr(pipe, name, None) is None]
    if missing:
        said = f": {failed[-1]}" if failed else ""
        raise OSError(f"diffusers could not load {', '.join(missing)}{said}")
    return pipe


def listed(root: Path) -> list[str]:
    """The components a checkpoint's index names with a class (an optional component
    it lacks is saved as null and is not loaded)."""
    path = root / INDEX if (root / INDEX).is_file() else root / "model_index.json"
    index = json.loads(path.read_text())
    return [name for name, entry in index.items() if not name.startswith("_")
            and isinstance(entry, list) and len(entry) >= 2 and entry[0] is not None]


class _Failures(logging.Handler):
    """diffusers' warnings while loading components: the reason a component is None."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.said: list[str] = []

    def emit(self, record):
        lines = [line for line in record.getMessage().splitlines() if line.strip()]
        self.said.append(lines[-1].strip() if lines else "")


@contextlib.contextmanager
def _failures():
    handler = _Failures()
    logger = logging.getLogger("diffusers.modular_pipelines.modular_pipeline")
    logger.addHandler(handler)
    try:
        yield handler.said
    finally:
        logger.removeHandler(handler)
