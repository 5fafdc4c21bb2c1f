"""Turn ``model.source`` into a diffusers pipeline on the host, in torch: the load pass.

Components whose checkpoint files hold exactly their tensors are built empty (their
parameters on the meta device) and read tensor by tensor at placement, straight into
their shards; the rest load on the host. ``porter compile`` builds every component
on the meta device instead (``abstract``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from porter.errors import LoadError, Problem, UsageError, first_line
from porter.loading import abstract, checkpoints, modular, single_file
from porter.loading import weights as checkpoint_weights
from porter.recipe.modular import INDEX, is_modular
from porter.recipe.sources import source_kind
from porter.shims import lazy
from porter.transforms import Checking, Pass, dtypes, lora
from porter.transforms.building import Loaded

torch = lazy.module("torch", __name__)

#: the index files that make a directory a diffusers pipeline (classic, modular)
INDEXES = ("model_index.json", INDEX)

if TYPE_CHECKING:
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe
    from porter.transforms.building import Building


def source_problems(recipe: Recipe) -> list[Problem]:
    found = [recipe.problem(f"model.{name}", problem, hint=f"a .safetensors file or a "
                            f"PyTorch checkpoint (.pth) holding the {name}'s weights")
             for name, path in single_file.given(recipe).items()
             for problem in single_file.file_problems(path)]
    return found + _source_problems(recipe)


def _source_problems(recipe: Recipe) -> list[Problem]:
    source = recipe.model.source
    kind = source_kind(source)
    if kind == "missing":
        return [recipe.problem("model.source", f"{source!r} is not 'tiny', an existing "
                               "directory, or a hub id (org/name)",
                               hint="check the path; relative paths start from the "
                                    "current directory")]
    root = Path(source).expanduser()
    if kind == "local" and not any((root / index).exists() for index in INDEXES):
        return [recipe.problem("model.source", f"{source!r} is not a diffusers pipeline "
                               "directory (no model_index.json or "
                               "modular_model_index.json)",
                               hint="point at the folder written by save_pretrained")]
    return []


def load_pipeline(family: ModelFamily, recipe: Recipe):
    """The recipe's pipeline in torch (CPU), weights in the recipe's dtypes, eval mode."""
    pipe = load_untouched(family, recipe)
    dtypes.apply_all(pipe.components, recipe)
    return pipe


def torch_components(pipe) -> dict:
    """The pipeline's components that are torch modules, by name."""
    return {n: c for n, c in pipe.components.items() if isinstance(c, torch.nn.Module)}


def load_for_port(family: ModelFamily, recipe: Recipe) -> Loaded:
    """The pipeline to port, where the weights of its empty components lie, and what
    names the checkpoint.

    A component whose checkpoint files hold exactly its tensors is built with its
    parameters on the meta device and returned in ``weights`` (component ->
    ``ComponentWeights``): porting reads its tensors one at a time, straight into
    their shards. The rest (tiny models, formats only the library can convert) are
    loaded on the host as before. LoRA and the recipe's dtypes are the next passes
    (``porter.port.passes``): on the meta device they cost nothing, so each tensor is
    placed in its final dtype.
    """

    kind = source_kind(recipe.model.source)
    if kind == "tiny":
        pipe, weights = _loaded(family, recipe), {}
        checkpoint = {"source": "tiny", "variant": recipe.model.variant,
                      "config": recipe.model.config}
    else:
        root = _local_root(family.pipeline_class(recipe), recipe.model.source, kind,
                           elsewhere_components(recipe))
        empty, weights = _empty_components(root, elsewhere_components(recipe))
        pipe = from_pretrained(family.pipeline_class(recipe), root, _torch_dtypes(recipe),
                                recipe.model.source, components=empty)
        _eval(pipe)
        checkpoint = checkpoints.identity(root, recipe.model.source if kind == "hub"
                                          else None)
    for name, path in single_file.given(recipe).items():  # read at placement, as a
        # checkpoint is
        weights[name] = single_file.located(path, _component(pipe, name),
                                            single_file.converter_of(family, name),
                                            f"model.{name}")
        checkpoint.setdefault("files", {})[f"model.{name}"] = single_file.identity(path)
        checkpoint.setdefault("read_as", {})[f"model.{name}"] = weights[name].read_as
    return Loaded(pipe, torch_components(pipe), weights, checkpoint)


def _component(pipe, name: str) -> torch.nn.Module:
    module = pipe.components.get(name)
    if not isinstance(module, torch.nn.Module):
        raise UsageError(f"model.{name}: this pipeline has no {name} to read it into",
                         hint=f"its components: {', '.join(torch_components(pipe))}")
    return module


def elsewhere_components(recipe: Recipe) -> tuple[str, ...]:
    """The components whose weights come from a file of their own (``model.transformer``,
    ``model.vae``, ``model.text_encoder``): model.source needs only their configuration."""
    return tuple(single_file.given(recipe))


def checkpoint_files(recipe: Recipe) -> dict | None:
    """The ``files`` of the checkpoint's identity (``checkpoints.identity``) as they are
    on disk now, from headers, without loading, ``model.transformer``'s too: None for a
    tiny model (without such a file), or a hub checkpoint not in the local cache yet."""

    source = recipe.model.source
    kind = source_kind(source)
    if kind == "local":
        root = Path(source).expanduser()
    elif kind == "hub":
        from huggingface_hub import snapshot_download
        try:
            root = Path(snapshot_download(source, local_files_only=True))
        except Exception:  # not cached (or no such repository): nothing to compare yet
            return None
    else:
        root = None
    files = checkpoints.identity(root)["files"] if root is not None else None
    for name, path in single_file.given(recipe).items():
        files = {**(files or {}), f"model.{name}": single_file.identity(path)}
    return files


def _empty_components(root: Path, elsewhere: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """Components whose weights can be read tensor by tensor: built empty, with
    where each tensor lies (``elsewhere``: built empty, located by the caller)."""

    empty, found = {}, {}
    for name, (library, cls) in abstract.module_classes(root).items():
        module = abstract.empty_component(library, cls, root / name)
        if name in elsewhere:
            empty[name] = module
            continue
        located = checkpoint_weights.for_module(module, root / name, library)
        if located is not None:
            empty[name], found[name] = module, located
    return empty, found


def load_untouched(family: ModelFamily, recipe: Recipe):
    """The pipeline as its source gives it, with the recipe's LoRA adapters fused
    (dtypes not yet applied), in eval mode."""

    pipe = _loaded(family, recipe)
    for name, path in single_file.given(recipe).items():  # on the host, as the file has it
        module = _component(pipe, name)
        single_file.materialize(module, single_file.located(
            path, module, single_file.converter_of(family, name), f"model.{name}"),
            torch.float32)
    lora.apply(family, recipe, pipe, {})
    return pipe


def _loaded(family: ModelFamily, recipe: Recipe):
    source = recipe.model.source
    kind = source_kind(source)
    if kind == "tiny":
        pipe = family.build_tiny(recipe)
    elif kind in ("local", "hub"):
        cls, elsewhere = family.pipeline_class(recipe), elsewhere_components(recipe)
        root = _local_root(cls, source, kind, elsewhere)
        # a component whose weights come from a file of its own: built empty from its
        # configuration (the folder may hold no weights for it); the caller fills it
        empty = {name: abstract.empty_component(library, module_class, root / name)
                 for name, (library, module_class) in abstract.module_classes(root).items()
                 if name in elsewhere}
        pipe = from_pretrained(cls, root, _torch_dtypes(recipe), source, components=empty)
    else:
        raise LoadError(f"model source {source!r} does not exist",
                        hint="use 'tiny', a local diffusers directory, or a hub id")
    _eval(pipe)
    return pipe


def _torch_dtypes(recipe: Recipe) -> dict:
    """Load each component straight into its dtype: no float32 copy of a bfloat16
    model is ever made, and float32 components lose nothing."""
    return {"default": dtypes.DTYPES[recipe.model.dtype],
            **{k: dtypes.DTYPES[v] for k, v in recipe.dtypes.components.items()}}


def _local_root(cls, source: str, kind: str, elsewhere: tuple[str, ...] = ()) -> Path:
    """The checkpoint's directory (a hub id: its snapshot, fetched unless offline),
    its weight-file headers checked: a bad file fails here, not mid-load or mid-run."""
    if kind == "local":
        root = Path(source).expanduser()
    else:
        try:
            root = Path(_download(cls, source))
        except (OSError, ValueError) as exc:
            raise _load_error(cls, source, exc) from exc
    checkpoints.check(root, elsewhere)
    return root


def _download(cls, source: str) -> str:
    """A hub checkpoint's local snapshot (a modular pipeline class has no ``download``:
    its whole repository is fetched)."""
    if is_modular(cls):
        from huggingface_hub import snapshot_download

        return snapshot_download(source)
    return cls.download(source)


def from_pretrained(cls, root: Path, dtype, source: str, components: dict | None = None):
    """The pipeline from ``root``; ``components`` (already built) are used as given."""
    try:
        if is_modular(cls):
            return modular.load(cls, root, dtype, components or {})
        return cls.from_pretrained(str(root), torch_dtype=dtype, **(components or {}))
    except (OSError, ValueError) as exc:
        raise _load_error(cls, source, exc) from exc


def _load_error(cls, source: str, exc: Exception) -> LoadError:
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    hint = ("the files must be in the local Hugging Face cache when HF_HUB_OFFLINE=1"
            if offline else "no network? download once elsewhere and point "
            "model.source at the local directory")
    # diffusers' words point at a stack trace a user is not shown: what it says is all
    reason = first_line(exc).replace(STACK_POINTER, "").strip()
    return LoadError(f"cannot load {source!r} as {cls.__name__}: {reason}", hint=hint)


#: the sentence diffusers ends a failed hub lookup with
STACK_POINTER = "Please check out the root cause in the stacktrace above."


def _eval(pipe) -> None:
    for module in _modules(pipe):
        module.eval()  # dropout off: a freshly built module starts in training mode


def _modules(pipe):
    for value in pipe.components.values():
        if isinstance(value, torch.nn.Module):
            yield value


# ------------------------------------------------------------------------- the pass

def _check(c: Checking) -> list[Problem]:
    return source_problems(c.recipe)


def _apply(b: Building) -> None:
    b.say(f"loading {b.family.name} from {b.recipe.model.source} ({b.recipe.model.dtype})")
    b.load = load_for_port(b.family, b.recipe)


def _abstract(b: Building) -> None:
    modules = abstract.components(b.family, b.recipe)
    if modules is None:
        raise UsageError(f"cannot compile {b.recipe.model.source!r} without its "
                         "configuration", hint="point model.source at a local diffusers "
                         "directory (configuration files are enough)")
    b.load = Loaded(MetaPipeline(modules), modules, {}, {})


class MetaPipeline:
    """Meta components standing in for a pipeline: what set-up calls and rotary tables
    reach (``pipe.transformer``, ``pipe.components``)."""

    def __init__(self, modules: dict):
        self.components = modules
        self.__dict__.update(modules)


def _fit(c: Checking) -> list[Problem]:
    recipe, family, modules = c.recipe, c.family, c.modules
    transformer = modules.get("transformer")
    found = [] if transformer is None else family.size_problems(recipe, transformer.config)
    for name, path in single_file.given(recipe).items():  # headers against the model:
        module = modules.get(name)  # nothing loaded
        if module is None:
            found.append(recipe.problem(f"model.{name}", f"this pipeline has no {name}",
                                        hint=f"its components: {', '.join(modules)}"))
            continue
        refused = single_file.problems(path, module.torch(),
                                       single_file.converter_of(family, name))
        shown = refused[:single_file.SHOWN]
        hidden = len(refused) - len(shown)
        found += [recipe.problem(f"model.{name}", problem.text + (
            f"; and {hidden} more ({len(refused)} problems with {path.name})"
            if hidden and problem is shown[-1] else ""), hint=problem.hint)
            for problem in shown]  # the count says so: the recipe's is of those shown
    return found


def _detail(c: Checking) -> str:
    return c.recipe.model.source


PASS = Pass(
    "load", ("model",), "build the pipeline on the host; components whose checkpoint "
    "files hold exactly their tensors are built empty and read at placement",
    check=_check, fit=_fit, apply=_apply, abstract=_abstract, detail=_detail)
