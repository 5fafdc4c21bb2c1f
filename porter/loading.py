"""Turn ``model.source`` into a diffusers pipeline on the host, in torch."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from porter.errors import LoadError, Problem
from porter.transforms import dtypes

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


def source_problems(recipe) -> list[Problem]:
    source = recipe.model.source
    kind = source_kind(source)
    if kind == "missing":
        return [recipe.problem("model.source", f"{source!r} is not 'tiny', an existing "
                               "directory, or a hub id (org/name)",
                               hint="check the path; relative paths start from the "
                                    "current directory")]
    if kind == "local" and not (Path(source).expanduser() / "model_index.json").exists():
        return [recipe.problem("model.source", f"{source!r} is not a diffusers pipeline "
                               "directory (no model_index.json)",
                               hint="point at the folder written by save_pretrained")]
    return []


def load_pipeline(family, recipe):
    """The recipe's pipeline in torch (CPU), weights in the recipe's dtypes, eval mode."""
    pipe = load_untouched(family, recipe)
    dtypes.apply_all(pipe.components, recipe)
    return pipe


def load_untouched(family, recipe):
    """The pipeline as its source gives it (dtypes not yet applied), in eval mode."""
    source = recipe.model.source
    kind = source_kind(source)
    if kind == "tiny":
        pipe = family.build_tiny(recipe)
    elif kind in ("local", "hub"):
        if kind == "local":  # headers only: a bad file fails here, not mid-load or mid-run
            from porter import checkpoints  # imports porter.abstract, which imports this
            checkpoints.check(Path(source).expanduser())
        # Load each component straight into its dtype: no float32 copy of a
        # bfloat16 model is ever made, and float32 components lose nothing.
        torch_dtype = {"default": dtypes.DTYPES[recipe.model.dtype],
                       **{k: dtypes.DTYPES[v] for k, v in recipe.dtypes.components.items()}}
        pipe = _from_pretrained(family.pipeline_class(recipe), source, torch_dtype, kind)
    else:
        raise LoadError(f"model source {source!r} does not exist",
                        hint="use 'tiny', a local diffusers directory, or a hub id")
    for module in _modules(pipe):
        module.eval()  # dropout off: a freshly built module starts in training mode
    return pipe


def _from_pretrained(cls, source: str, dtype, kind: str):
    path = str(Path(source).expanduser()) if kind == "local" else source
    try:
        return cls.from_pretrained(path, torch_dtype=dtype)
    except (OSError, ValueError) as exc:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        hint = ("the files must be in the local Hugging Face cache when HF_HUB_OFFLINE=1"
                if offline else "no network? download once elsewhere and point "
                "model.source at the local directory")
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LoadError(f"cannot load {source!r} as {cls.__name__}: {first}",
                        hint=hint) from exc


def _modules(pipe):
    for value in pipe.components.values():
        if isinstance(value, torch.nn.Module):
            yield value
