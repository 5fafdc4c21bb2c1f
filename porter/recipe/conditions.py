"""Condition objects from a recipe: ``generate.conditions`` and
``generate.reference_conditions``, for the pipelines whose call takes a list of the
pipeline's own condition dataclass (LTX-2's ``LTX2VideoCondition``: frames, the frame
index they go at, a strength; LTX-Video's ``LTXVideoCondition``; LTX-2 HDR and IC-LoRA
reference conditions).

Each item is a mapping of the dataclass's fields. The dataclass is the one the call's
annotation names, so a new pipeline with its own condition class needs no code here. A
string value is a path to the media (condition objects carry images and videos, not
text): an image file is one PIL image, a video file or a folder of frames a list of
them, read as ``generate.video`` is.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing

#: recipe keys that hold condition lists (each is also the call's argument name)
KEYS = ("conditions", "reference_conditions")


def condition_class(cls, key: str) -> type | None:
    """The dataclass ``cls.__call__``'s ``key`` argument takes (one or a list of them),
    or None when the call takes no such argument or names no dataclass."""
    parameter = inspect.signature(cls.__call__).parameters.get(key)
    if parameter is None:
        return None
    pending = [parameter.annotation]
    while pending:
        annotation = pending.pop()
        if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
            return annotation
        pending += typing.get_args(annotation)
    return None


def problems(recipe, cls, key: str) -> list:
    """What is wrong with ``generate.<key>`` for the pipeline ``cls``: a call that takes
    no condition objects there, fields the dataclass lacks or needs, missing files."""
    items = getattr(recipe.generate, key)
    if not items:
        return []
    where = f"generate.{key}"
    target = condition_class(cls, key)
    if target is None:
        return [recipe.problem(where, f"{cls.__name__}'s {key} argument takes no condition "
                               "objects Porter can build", hint=f"leave generate.{key} out")]
    fields = {f.name: f for f in dataclasses.fields(target)}
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
            if isinstance(value, str) and not recipe.file_path(where, value).exists():
                found.append(recipe.problem(where, f"{here}.{name}: no such file: {value}",
                                            hint="give an image, a video file or a folder "
                                            "of frames (relative to the recipe's folder)"))
    return found


def objects(recipe, cls, key: str) -> list:
    """``generate.<key>`` as the pipeline's condition objects, media read from disk."""
    from porter.images import load_media

    target = condition_class(cls, key)
    return [target(**{name: load_media(recipe.file_path(f"generate.{key}", value))
                      if isinstance(value, str) else value for name, value in item.items()})
            for item in getattr(recipe.generate, key)]
