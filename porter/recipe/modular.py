"""What a modular diffusers pipeline class declares, read from its blocks without
loading anything: the inputs its call takes, what it gives back, the components it
expects. (``ModularPipeline`` classes assemble blocks at run time; their ``__call__``
takes ``**kwargs``, so their blocks, not a signature, say what a recipe may set.)"""

from __future__ import annotations

import functools
import inspect
import json
from pathlib import Path

#: the index file of a modular checkpoint (a classic one has model_index.json)
INDEX = "modular_model_index.json"

#: guidance settings a modular pipeline takes as a guider component's ``guidance_scale``
#: (its blocks have no such input), by the guider they set: the recipe's
#: ``generate.guidance_scale`` and ``guidance_scale_2``, and ``generate.extra.
#: audio_guidance_scale`` for the sound's guider (LTX-2)
GUIDERS = {"guidance_scale": "guider", "guidance_scale_2": "guider_2",
           "audio_guidance_scale": "audio_guider"}


def is_modular(cls) -> bool:
    """Is ``cls`` a modular pipeline class (not DiffusionPipeline's kind)?"""
    import diffusers

    return isinstance(cls, type) and issubclass(cls, diffusers.ModularPipeline)


@functools.cache
def blocks(cls):
    """The blocks ``cls`` assembles by default (its ``default_blocks_name``)."""
    import diffusers

    return getattr(diffusers, cls.default_blocks_name)()


def outputs(cls) -> list[str]:
    """What the class's blocks give back (``videos``, ``audio``, ``images``, ...)."""
    return [output.name for output in blocks(cls).outputs]


def components(cls) -> list[str]:
    """The components its blocks expect, by name (guiders and processors included)."""
    return [spec.name for spec in blocks(cls).expected_components]


def parameters(cls) -> dict[str, inspect.Parameter]:
    """The call's inputs as keyword parameters, each with its default and type hint,
    and the guidance scales of the guiders it expects (``GUIDERS``). None is required
    here: the blocks count values an earlier block makes as required inputs, so
    diffusers itself says what a call lacks."""
    found = {}
    for param in blocks(cls).inputs:
        if param.name is None:  # a group of values other blocks make (kwargs_type)
            continue
        annotation = param.type_hint if param.type_hint is not None \
            else inspect.Parameter.empty
        found[param.name] = inspect.Parameter(param.name, inspect.Parameter.KEYWORD_ONLY,
                                              default=param.default, annotation=annotation)
    for key in guided(cls):
        found[key] = inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=None)
    return found


def guided(cls) -> dict[str, str]:
    """The guidance settings ``cls`` takes on a guider (setting -> guider): those of
    ``GUIDERS`` whose guider its blocks expect and that are not an input of its own."""
    inputs = {param.name for param in blocks(cls).inputs}
    return {key: guider for key, guider in GUIDERS.items()
            if guider in components(cls) and key not in inputs}


def class_name(root: Path) -> str | None:
    """The pipeline class a modular checkpoint names (its index's ``_class_name``)."""
    try:
        name = json.loads((root / INDEX).read_text()).get("_class_name")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) else None
