"""Condition objects from a recipe: ``generate.conditions`` and
``generate.reference_conditions``, for the pipelines whose call takes a list of the
pipeline's own condition dataclass (LTX-2's ``LTX2VideoCondition``: frames, the frame
index they go at, a strength; LTX-Video's ``LTXVideoCondition``; LTX-2 HDR and IC-LoRA
reference conditions).

Each item is a mapping of the dataclass's fields. The dataclass is the one the call's
annotation names, so a new pipeline with its own condition class needs no code here. A
field whose annotation takes PIL images is media: its value is a path, read as one
image (a field of images), a list of frames (a field of lists: a video file or a folder
of frames, as ``generate.video``), or either by the file (a field that takes both).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import TYPE_CHECKING

from porter.errors import UsageError
from porter.recipe.inputs import KIND_NAMES, load

if TYPE_CHECKING:
    from porter.recipe import Recipe

#: recipe keys that hold condition lists (each is also the call's argument name)
KEYS = ("conditions", "reference_conditions")


def condition_class(annotation) -> type | None:
    """The dataclass a call argument's ``annotation`` takes (one or a list of them), or
    None when it names none."""
    pending = [annotation]
    while pending:
        annotation = pending.pop()
        if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
            return annotation
        pending += typing.get_args(annotation)
    return None


def media(target: type) -> dict[str, str]:
    """The fields of ``target`` that hold media, each with how its path is read:
    ``image``, ``video`` (a list of frames) or ``either``."""
    from PIL import Image

    found = {}
    for name, annotation in typing.get_type_hints(target).items():
        members = typing.get_args(annotation) or (annotation,)
        image = Image.Image in members
        frames = any(typing.get_origin(m) is list and Image.Image in typing.get_args(m)
                     for m in members)
        if image or frames:
            found[name] = "either" if image and frames else "image" if image else "video"
    return found


def problems(recipe: Recipe, pipeline: str, annotation, key: str) -> list:
    """What is wrong with ``generate.<key>`` for the call argument of that name (its
    ``annotation``) of the pipeline class ``pipeline``: no condition objects there,
    fields the dataclass lacks or needs, missing files."""
    items = getattr(recipe.generate, key)
    if not items:
        return []
    where = f"generate.{key}"
    target = condition_class(annotation)
    if target is None:
        return [recipe.problem(where, f"{pipeline}'s {key} argument takes no condition "
                               "objects Porter can build", hint=f"leave generate.{key} out")]
    fields = {f.name: f for f in dataclasses.fields(target)}
    paths = media(target)
    needed = [name for name, f in fields.items() if f.default is dataclasses.MISSING
              and f.default_factory is dataclasses.MISSING]
    found = []
    for index, item in enumerate(items):
        here = f"{where}[{index}]"
        for name in item:
            if name not in fields:
                found.append(recipe.problem(where, f"{here}: {target.__name__} has no field "
                                            f"{name!r}", hint="its fields: "
                                            + ", ".join(fields)))
        for name in needed:
            if name not in item:
                found.append(recipe.problem(where, f"{here}: {target.__name__} needs {name}",
                                            hint=f"set {name} (a path for media)"))
        for name, value in item.items():
            if name not in paths:
                continue
            what = KIND_NAMES[paths[name]]
            if not isinstance(value, str):
                found.append(recipe.problem(where, f"{here}.{name}: expected a path",
                                            hint=f"give {what}"))
            elif not recipe.file_path(where, value).exists():
                found.append(recipe.problem(where, f"{here}.{name}: no such file: {value}",
                                            hint=f"give {what}; "
                                                 + recipe.relative_paths(where)))
    return found


def objects(recipe: Recipe, pipeline: str, annotation, key: str) -> list:
    """``generate.<key>`` as the pipeline's condition objects, media read from disk."""
    target = condition_class(annotation)
    if target is None:
        raise UsageError(f"{pipeline}'s {key} argument takes no condition objects "
                         "Porter can build", hint=f"leave generate.{key} out")
    paths = media(target)
    return [target(**{name: load(paths[name], recipe.file_path(f"generate.{key}", value))
                      if name in paths else value for name, value in item.items()})
            for item in getattr(recipe.generate, key)]
