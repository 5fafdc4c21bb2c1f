"""Denoising progress: the latents and scheduler state after a completed step.

Saved every ``output.checkpoint_every`` steps and when a run is interrupted, as
the ``progress`` artifact; ``--resume`` continues from it. Multistep schedulers
(UniPC, DPM-Solver) keep earlier model outputs, so the scheduler's own state is
saved with the latents: its tensors go to safetensors, everything else to
JSON. Nothing is pickled, so loading a checkpoint cannot run code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from porter.errors import UsageError, kind_of
from porter.rundir import artifacts
from porter.runtime import distributed

if TYPE_CHECKING:
    from porter.recipe import Recipe

PROGRESS = "progress"
_SKIP = ("_internal_dict", "config")  # the config is rebuilt from the recipe


@dataclass
class Progress:
    step: int  # steps completed
    latents: object  # torch tensor (host or JAX-backed)
    scheduler_tensors: dict  # from ``scheduler_state``
    scheduler_description: dict
    source: object = None  # the record it was read from (a Path), for errors
    history: list = field(default_factory=list)  # where the steps so far ran
    sampling: dict = field(default_factory=dict)  # ``Sampling.state()``: random stream, carry
    #: the schedule the steps were taken on (``porter.transforms.scheduler.describe``);
    #: None in a checkpoint written before it was recorded
    schedule: dict | None = None


def _is_tensor(value) -> bool:
    return isinstance(value, torch.Tensor)


def scheduler_state(scheduler) -> tuple[dict, dict]:
    """(tensors by key, JSON description) of the scheduler's mutable state.

    The description maps each attribute to a value, a tensor key, or a list of
    tensor keys (None for empty slots), and lists the keys that lived on JAX.
    """
    tensors, attributes = {}, {}

    def keep(key, tensor):
        tensors[key] = tensor
        return key

    for name, value in vars(scheduler).items():
        if name in _SKIP:
            continue
        if _is_tensor(value):
            attributes[name] = {"tensor": keep(name, value)}
        elif isinstance(value, (list, tuple)) and any(_is_tensor(v) for v in value):
            if not all(v is None or _is_tensor(v) for v in value):
                raise _unsupported(scheduler, name, value)
            attributes[name] = {"tensors": [None if v is None else keep(f"{name}.{i}", v)
                                            for i, v in enumerate(value)]}
        elif _plain(value):
            attributes[name] = {"value": value}
        else:
            raise _unsupported(scheduler, name, value)
    on_jax = sorted(key for key, tensor in tensors.items() if hasattr(tensor, "jax"))
    return tensors, {"attributes": attributes, "on_jax": on_jax}


def _plain(value) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    return isinstance(value, (list, tuple)) and all(_plain(v) for v in value)


def _unsupported(scheduler, name, value) -> UsageError:
    return UsageError(f"cannot checkpoint {type(scheduler).__name__}.{name} "
                      f"({type(value).__name__})",
                      hint="set output.checkpoint_every: 0 to run without progress "
                           "checkpoints for this scheduler")


def restore_scheduler(scheduler, tensors: dict, description: dict, to_jax,
                      source=None, step: int | None = None) -> None:
    """Put saved state back; tensors that lived on JAX go back through ``to_jax``.
    Each saved attribute must be one the scheduler has, of the kind it holds now
    (after ``set_timesteps``), and its step counter must agree with ``step`` (the
    steps completed, when given); UsageError naming ``source`` and the key if not."""
    _check_kinds(scheduler, tensors, description, source)
    if step is not None:
        _check_counters(description["attributes"], step,
                        source or "the denoising checkpoint")
    on_jax = set(description["on_jax"])

    def placed(key):
        return to_jax(tensors[key]) if key in on_jax else tensors[key]

    for name, entry in description["attributes"].items():
        if "tensor" in entry:
            value = placed(entry["tensor"])
        elif "tensors" in entry:
            value = [None if key is None else placed(key) for key in entry["tensors"]]
        else:
            value = entry["value"]
        setattr(scheduler, name, value)


#: kinds one scheduler attribute may take in turn (a count kept as a number)
_NUMBERS = {"an integer", "a number"}


def _check_kinds(scheduler, tensors: dict, description: dict, source) -> None:
    where = source or "the denoising checkpoint"
    for name, entry in description["attributes"].items():
        key = f"scheduler.attributes.{name}"
        if name.startswith("__") or not name.isidentifier():
            raise UsageError(f"{where}: {key}: not a scheduler attribute", hint=REDO)
        # state a scheduler sets during its first step (UniPC's this_order) is absent
        # after set_timesteps: any plain value may fill it
        current = getattr(scheduler, name, None)
        saved = ("a tensor" if "tensor" in entry else "a list" if "tensors" in entry
                 else None if entry["value"] is None else kind_of(entry["value"]))
        now = kind_of(current)
        if current is not None and saved is not None and saved != now \
                and not {saved, now} <= _NUMBERS:
            raise UsageError(f"{where}: {key}: {saved} where {type(scheduler).__name__} "
                             f"holds {now}", hint=REDO)
        # an index or a count with a fraction fails deep in the scheduler's step
        if isinstance(current, int) and isinstance(entry.get("value"), float):
            raise UsageError(f"{where}: {key}: {entry['value']!r} is a fraction where "
                             f"{type(scheduler).__name__} holds a whole number", hint=REDO)


REDO = ("delete the progress-*.json and .safetensors files to start denoising over, "
        "or resume with the recipe that wrote them")


def _check_record(meta: dict, tensors: dict, path) -> None:
    """The progress record's own keys: a step count (its end is checked against the
    schedule when denoising starts), and a scheduler description whose every tensor
    key names a saved tensor."""
    step = meta.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise UsageError(f"{path}: step: {step!r} is not a completed step (1 or more)",
                         hint=REDO)
    if "latents" not in tensors:
        raise UsageError(f"{path}: tensors: no 'latents'", hint=REDO)
    description = meta.get("scheduler")
    attributes = description.get("attributes") if isinstance(description, dict) else None
    if not isinstance(attributes, dict) or not isinstance(description.get("on_jax"), list):
        raise UsageError(f"{path}: scheduler: expected attributes and on_jax", hint=REDO)
    for name, entry in attributes.items():
        key = f"scheduler.attributes.{name}"
        if not isinstance(entry, dict) or len(set(entry) & {"tensor", "tensors", "value"}) != 1:
            raise UsageError(f"{path}: {key}: expected one of tensor, tensors, value",
                             hint=REDO)
        keys = [entry["tensor"]] if "tensor" in entry else entry.get("tensors") or []
        if "tensors" in entry and not isinstance(entry["tensors"], list):
            raise UsageError(f"{path}: {key}.tensors: expected a list", hint=REDO)
        for tensor_key in keys:
            if tensor_key is None and "tensor" not in entry:
                continue  # an empty slot of a list (UniPC's model outputs at first)
            if not isinstance(tensor_key, str):
                raise UsageError(f"{path}: {key}: {tensor_key!r} is not a tensor's name",
                                 hint=REDO)
            if f"scheduler.{tensor_key}" not in tensors:
                raise UsageError(f"{path}: {key}: names tensor {tensor_key!r}, which the "
                                 "file does not hold", hint=REDO)
        if "value" in entry and not _plain(entry["value"]):
            raise UsageError(f"{path}: {key}.value: not a plain value", hint=REDO)
    for tensor_key in description["on_jax"]:
        if not isinstance(tensor_key, str) or f"scheduler.{tensor_key}" not in tensors:
            raise UsageError(f"{path}: scheduler.on_jax: {tensor_key!r} is not a tensor "
                             "the file holds", hint=REDO)
    for name in _COUNTERS:
        _count(attributes, name, path)


#: diffusers schedulers count the steps they took: ``_step_index`` starts at
#: ``_begin_index`` (or, without one, where the first timestep lies in the schedule:
#: 0, or 1 when it is repeated) and grows by one a step
_COUNTERS = ("_begin_index", "_step_index")


def _check_counters(attributes: dict, step: int, path) -> None:
    """The loop goes on at the record's ``step`` (checked against the schedule by
    now): a step counter that disagrees would index the schedule elsewhere (out of
    range, JAX clamps: no error, wrong values)."""
    begin, index = (_count(attributes, name, path) for name in _COUNTERS)
    if index is None:
        return
    expected = (begin + step,) if begin is not None else (step, step + 1)
    if index not in expected:
        raise UsageError(f"{path}: scheduler.attributes._step_index: {index} does not "
                         f"follow from step {step}" + (f" and _begin_index {begin}"
                                                       if begin is not None else ""),
                         hint=REDO)


def _count(attributes: dict, name: str, path) -> int | None:
    """A step counter's saved value (None: absent or unset); UsageError if it is not
    a count."""
    entry = attributes.get(name)
    if entry is None or entry.get("value", 0) is None:
        return None
    value = entry.get("value")
    if "value" not in entry or isinstance(value, bool) or not isinstance(value, int) \
            or value < 0:
        shown = repr(value) if "value" in entry else f"a {next(iter(entry))} entry"
        raise UsageError(f"{path}: scheduler.attributes.{name}: {shown} is not a count of "
                         "steps (0 or more)", hint=REDO)
    return value


def _stage(step: int) -> str:
    return f"{PROGRESS}-{step:06d}"


def _saved_steps(directory) -> list[int]:
    """Steps with a complete checkpoint, newest first."""

    steps = []
    for record in directory.glob(f"{PROGRESS}-*.json"):
        suffix = record.stem[len(PROGRESS) + 1:]
        if suffix.isdigit() and artifacts.complete(directory, record.stem):
            steps.append(int(suffix))
    return sorted(steps, reverse=True)


def save(directory, progress: Progress, recipe: Recipe, inputs: dict | None = None) -> None:
    """Write a checkpoint for ``progress.step``, then drop older ones (``inputs``: the
    files the port that made it loaded, ``artifacts.inputs_of``).

    Each checkpoint has its own files, so a kill at any moment leaves the last
    complete one intact (overwriting one pair in place would not).
    """

    tensors = {"latents": progress.latents,
               **{f"scheduler.{k}": v for k, v in progress.scheduler_tensors.items()},
               **{f"sampling.{k}": v for k, v in progress.sampling.items()}}
    artifacts.save(directory, _stage(progress.step), tensors, recipe,
                   extra={"step": progress.step, "scheduler": progress.scheduler_description,
                          "history": progress.history, "schedule": progress.schedule},
                   inputs=inputs)
    if not distributed.writes():
        return
    for step in _saved_steps(directory):
        if step != progress.step:
            _remove(directory, _stage(step))


def load(directory, recipe: Recipe) -> Progress | None:
    """The newest checkpoint, checked against this recipe (settings, file hash, finite
    values, a step inside the schedule), or None when there is none."""

    steps = _saved_steps(directory)
    if not steps:
        return None
    stage = _stage(steps[0])
    meta, tensors = artifacts.load_with_record(directory, stage, recipe)
    path = directory / f"{stage}.json"
    _check_record(meta, tensors, path)
    prefix = "scheduler."
    saved = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    history = meta.get("history") if isinstance(meta.get("history"), list) else []
    sampling = {k[len("sampling."):]: v for k, v in tensors.items()
                if k.startswith("sampling.")}
    schedule = meta.get("schedule") if isinstance(meta.get("schedule"), dict) else None
    return Progress(step=meta["step"], latents=tensors["latents"], scheduler_tensors=saved,
                    scheduler_description=meta["scheduler"], source=path, history=history,
                    sampling=sampling, schedule=schedule)


def discard(directory) -> None:
    """Checkpoints are superseded once the denoise stage is complete; files a kill
    left half-written go too."""
    if not distributed.writes():
        return
    for step in _saved_steps(directory):
        _remove(directory, _stage(step))
    for leftover in directory.glob(f"{PROGRESS}-*"):
        leftover.unlink(missing_ok=True)


def _remove(directory, stage: str) -> None:
    artifacts.remove(directory, stage)
