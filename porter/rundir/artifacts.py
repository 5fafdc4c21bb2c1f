"""Stage outputs saved in the run directory, so a run can stop and continue.

Each stage writes ``<stage>.safetensors`` and then ``<stage>.json``; both go
through a temporary name and an atomic rename, and the JSON is written last,
so a stage counts as complete only when its JSON exists. The JSON records the
model and generation settings the tensors were made with, the files they were
made from (each LoRA adapter's SHA-256, the checkpoint's files by their header
digests) and the SHA-256 of the tensors file: loading them for a recipe that
differs there, with an adapter or checkpoint file replaced since, or from a
tensors file changed since, is refused, and so are tensors holding NaN or
infinity.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from porter import loading
from porter.errors import UsageError
from porter.loading import checkpoints
from porter.runtime import atomic, distributed, finite
from porter.shims.interop import to_host
from porter.transforms import lora

if TYPE_CHECKING:
    from porter.recipe import Recipe

STAGES = ("encode", "denoise", "decode")


def settings(recipe: Recipe) -> dict:
    """What an artifact depends on: the model and the generation settings."""
    return settings_of(recipe.resolved())


def settings_of(data: dict) -> dict:
    """``settings`` from a resolved recipe's data (a run record's ``recipe``)."""
    found = {"model": data["model"], "generate": data["generate"], "dtypes": data["dtypes"]}
    if data["lora"]:  # absent when unused: records written before LoRA stay valid
        found["lora"] = data["lora"]
    if data.get("cache"):  # a step cache changes the latents
        found["cache"] = data["cache"]
    if (data.get("quantize") or {}).get("format"):  # 8-bit weights change the latents
        found["quantize"] = data["quantize"]
    scheduler = data.get("scheduler") or {}
    if scheduler.get("name") or scheduler.get("config"):  # absent when unused, as LoRA
        found["scheduler"] = scheduler
    return found


def inputs_of(checkpoint: dict | None) -> dict:
    """The files a stage is made from, beyond the recipe's settings, from the identity
    a run loaded (``loading.Loaded.checkpoint``, the run record's ``checkpoint``): the
    checkpoint's files (not where they lie) and each LoRA adapter's file and SHA-256."""
    checkpoint = checkpoint or {}
    return {"checkpoint_files": checkpoint.get("files"),
            "lora": [{"file": a["file"], "sha256": a["sha256"]}
                     for a in checkpoint.get("lora") or []]}


def inputs_now(recipe: Recipe) -> dict:
    """``inputs_of`` as the files are on disk now, with no weight loaded: each adapter
    hashed, the checkpoint's headers (a hub checkpoint's when it is in the cache)."""

    return {"checkpoint_files": loading.checkpoint_files(recipe),
            "lora": lora.digests(recipe)}


def save(directory: Path, stage: str, tensors: dict, recipe: Recipe,
         extra: dict | None = None,
         inputs: dict | None = None) -> None:
    """Write the stage's tensors, then its JSON record (plus ``extra`` keys), atomically.
    ``inputs``: what the port that made them loaded (``inputs_of``); without it, the
    files as they are now."""
    from safetensors.torch import save

    host = {name: to_host(t).contiguous() for name, t in tensors.items()}  # every process
    if not distributed.writes():
        return
    directory.mkdir(parents=True, exist_ok=True)
    # An older record must not vouch for the new tensors while they are replaced.
    (directory / f"{stage}.json").unlink(missing_ok=True)
    data = save(host)
    digest = atomic.write_bytes(directory / f"{stage}.safetensors", data)
    meta = {"stage": stage, "recipe_sha256": recipe.digest(), "settings": settings(recipe),
            "inputs": inputs if inputs is not None else inputs_now(recipe),
            "sha256": digest, "bytes": len(data),
            "tensors": {n: {"shape": list(t.shape), "dtype": str(t.dtype)} for n, t in
                        host.items()}, **(extra or {})}
    atomic.write_bytes(directory / f"{stage}.json", (json.dumps(meta, indent=2) + "\n")
                        .encode())


def remove(directory: Path, stage: str) -> None:
    """Delete a stage: the record first, so the tensors never count as complete alone."""
    for suffix in (".json", ".safetensors"):
        (directory / f"{stage}{suffix}").unlink(missing_ok=True)


def complete(directory: Path, stage: str) -> bool:
    return (directory / f"{stage}.json").exists() and \
        (directory / f"{stage}.safetensors").exists()


def digests(directory: Path) -> dict:
    """SHA-256 of each complete stage file in the directory, from its record."""
    return {f"{stage}.safetensors": json.loads((directory / f"{stage}.json").read_text())
            .get("sha256") for stage in STAGES[:-1] if complete(directory, stage)}


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


REDO = "delete the stage's files and run it again"


def check(directory: Path, stage: str, recipe: Recipe) -> dict:
    """The stage's record, if the stage is complete, was made with these settings and
    its file matches the record (header only: cheap enough to run before a run starts)."""
    record, tensors = directory / f"{stage}.json", directory / f"{stage}.safetensors"
    if record.exists() and not tensors.exists():
        raise UsageError(f"{tensors} is missing, though {record.name} says the {stage} "
                         "stage finished", hint=f"run `porter run RECIPE --stage {stage}` "
                         "again")
    if not complete(directory, stage):
        missing = [s for s in STAGES[:STAGES.index(stage) + 1] if not complete(directory, s)]
        runs = ", then ".join(f"`porter run RECIPE --stage {s}`" for s in missing)
        raise UsageError(f"no complete {stage} stage in {directory}",
                         hint=f"run {runs} first (or `porter run RECIPE` for every stage)")
    meta = _record(record)
    differences = _differences(meta["settings"], settings(recipe))
    if differences:
        shown = "; ".join(differences[:4]) + (" ..." if len(differences) > 4 else "")
        raise UsageError(f"{directory / stage}.safetensors was made with other settings: "
                         f"{shown}", hint="use the recipe that made it, or another "
                         "output.dir")
    problems = _header_problems(tensors, meta)
    if problems:
        raise UsageError(f"{tensors}: " + "; ".join(problems), hint=REDO)
    _check_inputs(tensors, meta, inputs_now(recipe))
    return meta


def _check_inputs(path: Path, meta: dict, now: dict) -> None:
    """The stage was made from the files this run would read: each LoRA adapter (by
    SHA-256) and the checkpoint (by its files' header digests). A record written
    before Porter kept them vouches for neither."""
    made = meta.get("inputs") if isinstance(meta.get("inputs"), dict) else {}
    what = str(path) + (f" (denoising progress after step {meta['step']})"
                        if isinstance(meta.get("step"), int) else "")
    hint = ("restore the file it was made with; or make it again: run without --resume "
            "and --stage, or into another output.dir")
    recorded = made.get("lora") if isinstance(made.get("lora"), list) else []
    for index, adapter in enumerate(now["lora"]):
        entry = recorded[index] if index < len(recorded) else None
        then = entry.get("sha256") if isinstance(entry, dict) else None
        if then != adapter["sha256"]:
            was = (f"SHA-256 {then[:12]}..." if isinstance(then, str)
                   else "no record of the adapter's digest")
            raise UsageError(f"{what} was made with another LoRA adapter: lora.{index}.file "
                             f"{adapter['file']} has SHA-256 {adapter['sha256'][:12]}... now; "
                             f"its record says {was}", hint=hint)
    files = now["checkpoint_files"]
    if files is not None and made.get("checkpoint_files") != files:
        then = made.get("checkpoint_files")
        raise UsageError(f"{what} was made from other checkpoint files: "
                         f"{_changed_files(then, files)}", hint=hint)


def _changed_files(then, now: dict) -> str:
    """The checkpoint files that differ, named (the first few)."""
    if not isinstance(then, dict):
        return "its record names none (written before Porter kept them)"
    names = sorted(name for name in set(then) | set(now) if then.get(name) != now.get(name))
    said = [f"{name} " + ("is new" if name not in then else "is gone" if name not in now
                          else "has changed") for name in names[:4]]
    return ", ".join(said) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _check_digest(path: Path, meta: dict, digest: str) -> None:
    """The tensors are the ones the record was written for (not edited since)."""
    if digest != meta["sha256"]:
        raise UsageError(f"{path} has changed since its record was written (SHA-256 "
                         f"{digest[:12]}..., the record says {meta['sha256'][:12]}...)",
                         hint=REDO)


def _record(path: Path) -> dict:
    """The stage's JSON record; UsageError if it is not the record ``save`` writes."""
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{path} is not a readable stage record: {exc}", hint=REDO) from None
    tensors = meta.get("tensors") if isinstance(meta, dict) else None
    if not (isinstance(tensors, dict) and isinstance(meta.get("settings"), dict)
            and isinstance(meta.get("sha256"), str)
            and all(isinstance(t, dict) and {"shape", "dtype"} <= set(t)
                    for t in tensors.values())):
        raise UsageError(f"{path} lacks the stage record's keys (settings, sha256, and "
                         "tensors with shape and dtype; records before file hashes have "
                         "no sha256)", hint=REDO)
    return meta


def _header_problems(path: Path, meta: dict) -> list[str]:
    """The file's header against its record: names, shapes and dtypes, and the file's
    size against its header (truncation), all before any tensor is read."""

    try:
        header = checkpoints.read_header(path)
    except (checkpoints.CorruptFile, OSError) as exc:
        return [f"cannot be read: {exc}"]
    problems = []
    for name, info in meta["tensors"].items():
        entry = header.get(name)
        if entry is None:
            problems.append(f"tensor {name!r} is missing, though its record lists it")
            continue
        if list(entry.shape) != list(info["shape"]):
            problems.append(f"tensor {name!r} is {list(entry.shape)}, its record says "
                            f"{info['shape']}")
        dtype = checkpoints.torch_dtype(entry.dtype)
        if str(dtype) != info["dtype"]:
            problems.append(f"tensor {name!r} has dtype {dtype or entry.dtype}, its record "
                            f"says {info['dtype']}")
    return problems


def load(directory: Path, stage: str, recipe: Recipe) -> dict:
    """The stage's tensors (host torch), after checking they fit this recipe."""
    return load_with_record(directory, stage, recipe)[1]


def load_with_record(directory: Path, stage: str, recipe: Recipe) -> tuple[dict, dict]:
    """(the stage's JSON record, its tensors), after checking they fit this recipe."""
    import hashlib

    from safetensors import SafetensorError
    from safetensors.torch import load

    meta = check(directory, stage, recipe)
    path = directory / f"{stage}.safetensors"
    try:
        data = path.read_bytes()
        # hashed once, on the bytes used (the file could change between two reads)
        _check_digest(path, meta, hashlib.sha256(data).hexdigest())
        tensors = load(data)
    except (SafetensorError, OSError) as exc:
        raise UsageError(f"{path} cannot be read: {exc}", hint=REDO) from None

    for name, tensor in tensors.items():
        bad = finite.count(tensor)
        if bad:
            raise UsageError(f"{path}: tensor {name!r} holds {bad} NaN or infinite "
                             f"value(s) of {tensor.numel()}", hint=REDO)
    return meta, tensors

