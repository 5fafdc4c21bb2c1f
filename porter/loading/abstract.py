"""Models with shapes but no weights (meta device), for checks and plans.

Built from a recipe alone: the family's tiny builder, or the configuration
files of a local diffusers directory. Nothing here reads a weight file.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from porter.loading import kept_sketches, modular, published
from porter.recipe.sources import source_kind
from porter.shims import lazy
from porter.transforms import dtypes, sketch
from porter.transforms.sketch import Sketch

torch = lazy.module("torch", __name__)

if TYPE_CHECKING:
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe

# model_index.json names the library of each component; only these are imported.
LIBRARIES = ("diffusers", "transformers")

@contextlib.contextmanager
def meta_device():
    """torch.device("meta") for the modules built inside. A diffusers model module first
    imported inside still makes its module-level tensors real (``porter.shims.
    model_imports``, which ``import porter`` installs): a later real load in the same
    process finds their values."""
    with torch.device("meta"):
        yield


def components(family: ModelFamily, recipe: Recipe) -> dict[str, torch.nn.Module] | None:
    """Component name -> module on the meta device, the recipe's dtypes applied; None
    when only weights could tell."""
    modules = _built(family, recipe)
    if modules is not None:
        dtypes.apply_all(modules, recipe)
    return modules


def sketches(family: ModelFamily, recipe: Recipe,
             guard=contextlib.nullcontext) -> dict[str, Sketch] | None:
    """Component name -> sketch (``porter.transforms.sketch``) of the model
    ``components`` builds, the recipe's dtypes applied; None when only weights could
    tell. Read from disk where this model was built before (``kept_sketches``: no torch
    imported), else built inside ``guard()``, sketched and kept. A check that needs a
    module (``Sketch.torch``) builds them all once."""
    found = kept_sketches.key(family, recipe)
    raw = kept_sketches.read(found) if found else None
    built: dict = {}
    if raw is None:
        with guard():
            modules = _built(family, recipe)
        if modules is None:
            return None
        raw = {name: sketch.of(module) for name, module in modules.items()}
        if found:
            kept_sketches.keep(found, raw)
        dtypes.apply_all(modules, recipe)
        built["modules"] = modules

    def module(name: str):
        if "modules" not in built:
            built["modules"] = components(family, recipe)
        return built["modules"][name]

    for name, entry in raw.items():
        entry.module = functools.partial(module, name)
    return dtypes.sketched(raw, recipe)


def import_classes(family: ModelFamily, recipe: Recipe) -> None:
    """Import the modules a build of the model imports (the pipeline's class, each
    component's class), where no check built it in this process: a run reads its checks'
    kept sketches. Before the patches apply: a module first imported under a patch
    keeps what it bound then (the tiny Wan run compiled 7 of its eager programs
    differently when its pipeline's modules were first imported while loading)."""
    try:
        family.pipeline_class(recipe)
    except NotImplementedError:
        pass  # a family that builds tiny models only need not name its class
    found = kept_sketches.key(family, recipe)
    # none kept: the checks built the model in this process, or none could be kept
    for entry in ((kept_sketches.read(found) if found else None) or {}).values():
        try:
            importlib.import_module(entry.class_module)
        except ImportError:
            pass  # a class whose module cannot be imported by name: the load imports it


def _built(family: ModelFamily, recipe: Recipe) -> dict[str, torch.nn.Module] | None:
    """The components on the meta device as built (no dtypes applied)."""
    kind = source_kind(recipe.model.source)
    if kind == "tiny":
        with meta_device():
            pipe = family.build_tiny(recipe)
        return {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    if kind == "local":
        return _from_configs(Path(recipe.model.source).expanduser())
    configs = family.official_configs(recipe.model.source)
    shipped = published.layout(recipe.model.source)
    if configs is not None:
        return {name: _build(*entry) for name, entry in configs.items()}
    if shipped is not None:
        return _from_configs(shipped)
    return None


def _build(library: str, class_name: str, config: dict) -> torch.nn.Module:
    """A module on the meta device from a configuration dict."""
    if library not in LIBRARIES:
        raise ValueError(f"unsupported library {library!r}")
    cls = getattr(importlib.import_module(library), class_name)
    with meta_device():
        if library == "diffusers":
            return cls.from_config(config)
        return cls(cls.config_class(**config))


def module_classes(root: Path) -> dict[str, tuple[str, type]]:
    """Component name -> (library, class) for each torch module model_index.json names
    (or a modular checkpoint's index, for the components stored under ``root``)."""
    # model_index.json first, as the classic loader and the generic family read it
    entries = None if (root / "model_index.json").exists() else modular.index_entries(root)
    if entries is None:
        index = json.loads((root / "model_index.json").read_text())
        entries = {name: (entry[0], entry[1]) for name, entry in index.items()
                   if not name.startswith("_") and isinstance(entry, list)}
    found = {}
    for name, (library, class_name) in entries.items():
        cls = _library_class(library, class_name)
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
            # a pipeline module's own model is built and read as its base's library's
            # are: LTX-2's connectors and vocoder as diffusers' models, Stable
            # Diffusion's safety checker (a transformers model) as transformers'
            found[name] = (library if library in LIBRARIES else _library_of(cls), cls)
    return found


def _library_of(cls: type) -> str:
    """The library whose models ``cls`` is built and read as: transformers' for its
    ``PreTrainedModel``s, as diffusers' own loader tells them apart."""
    from transformers import PreTrainedModel

    return "transformers" if issubclass(cls, PreTrainedModel) else "diffusers"


def _library_class(library, class_name):
    """The class an index names: from diffusers or transformers, or from the diffusers
    pipeline module an index names as its library (``["ltx2", "LTX2TextConnectors"]``:
    ``diffusers.pipelines.ltx2``); None for anything else."""
    if not isinstance(library, str) or not isinstance(class_name, str):
        return None
    if library in LIBRARIES:
        return getattr(importlib.import_module(library), class_name, None)
    try:
        module = importlib.import_module(f"diffusers.pipelines.{library}")
    except ImportError:
        return None
    return getattr(module, class_name, None)


def from_config_dir(library: str, cls: type, folder: Path) -> torch.nn.Module:
    """One component on the meta device, from the configuration in its folder."""
    with meta_device():
        if library == "diffusers":
            return cls.from_config(cls.load_config(folder))
        return cls(cls.config_class.from_pretrained(folder))


def empty_component(library: str, cls: type, folder: Path) -> torch.nn.Module:
    """One component from its configuration with its parameters on the meta device,
    to be filled from its weight files. Buffers are real: some hold values computed
    when the module is built that no file stores (rotary tables). Tied weights are
    tied, as the library's loader ties them."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        if library == "diffusers":
            module = cls.from_config(cls.load_config(folder))
        else:
            module = cls(cls.config_class.from_pretrained(folder))
    if callable(getattr(module, "tie_weights", None)):
        module.tie_weights()
    return module


def _from_configs(root: Path) -> dict[str, torch.nn.Module]:
    return {name: from_config_dir(library, cls, root / name)
            for name, (library, cls) in module_classes(root).items()}
