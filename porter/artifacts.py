"""Stage outputs saved in the run directory, so a run can stop and continue.

Each stage writes ``<stage>.safetensors`` and then ``<stage>.json``; both go
through a temporary name and an atomic rename, and the JSON is written last,
so a stage counts as complete only when its JSON exists. The JSON records the
model and generation settings the tensors were made with; loading them for a
recipe that differs there is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from porter.errors import UsageError

STAGES = ("encode", "denoise", "decode")


def settings(recipe) -> dict:
    """What an artifact depends on: the model and the generation settings."""
    data = recipe.resolved()
    return {"model": data["model"], "generate": data["generate"], "dtypes": data["dtypes"]}


def save(directory: Path, stage: str, tensors: dict, recipe) -> None:
    from safetensors.torch import save_file

    from porter.interop import to_host

    directory.mkdir(parents=True, exist_ok=True)
    host = {name: to_host(t).contiguous() for name, t in tensors.items()}
    partial = directory / f"{stage}.safetensors.partial"
    save_file(host, str(partial))
    os.replace(partial, directory / f"{stage}.safetensors")
    meta = {"stage": stage, "recipe_sha256": recipe.digest(), "settings": settings(recipe),
            "tensors": {n: {"shape": list(t.shape), "dtype": str(t.dtype)} for n, t in
                        host.items()}}
    partial = directory / f"{stage}.json.partial"
    partial.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(partial, directory / f"{stage}.json")


def complete(directory: Path, stage: str) -> bool:
    return (directory / f"{stage}.json").exists() and \
        (directory / f"{stage}.safetensors").exists()


def _differences(found: dict, expected: dict, prefix: str = "") -> list[str]:
    keys = sorted(set(found) | set(expected))
    out = []
    for key in keys:
        a, b = found.get(key), expected.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: artifact {a!r}, recipe {b!r}")
    return out


def check(directory: Path, stage: str, recipe) -> dict:
    """The stage's record, if the stage is complete and was made with these settings."""
    if not complete(directory, stage):
        raise UsageError(f"no complete {stage} stage in {directory}",
                         hint=f"run `porter run RECIPE --stage {stage}` first")
    meta = json.loads((directory / f"{stage}.json").read_text())
    differences = _differences(meta.get("settings", {}), settings(recipe))
    if differences:
        shown = "; ".join(differences[:4]) + (" ..." if len(differences) > 4 else "")
        raise UsageError(f"{directory / stage}.safetensors was made with other settings: "
                         f"{shown}", hint="use the recipe that made it, or another "
                         "output.dir")
    return meta


def load(directory: Path, stage: str, recipe) -> dict:
    """The stage's tensors (host torch), after checking they fit this recipe."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    meta = check(directory, stage, recipe)
    try:
        tensors = load_file(str(directory / f"{stage}.safetensors"))
    except (SafetensorError, OSError) as exc:
        raise UsageError(f"{directory / stage}.safetensors cannot be read: {exc}",
                         hint="delete it and run the stage again") from None
    for name, info in meta["tensors"].items():
        if name not in tensors or list(tensors[name].shape) != info["shape"]:
            found = list(tensors[name].shape) if name in tensors else "missing"
            raise UsageError(f"{directory / stage}.safetensors: tensor {name!r} is {found}, "
                             f"its record says {info['shape']}",
                             hint="delete the stage's files and run it again")
    return tensors
