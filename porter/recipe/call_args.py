"""The generic family's pipeline call, built from the pipeline's own signature.

diffusers video pipelines do not agree on argument names (``num_frames``,
``video_length``, ``frames``) nor on defaults (some have their own negative
prompt, guidance scale or text length). So each recipe setting is mapped onto
the name this pipeline uses; a setting the recipe leaves to its default is not
passed at all, leaving the pipeline's own default alone; a setting the pipeline
has no name for, or an ``extra`` key it does not take, is a problem found by
``validate``, naming what the pipeline does take.
"""

from __future__ import annotations

import difflib
import inspect
import types
import typing
from typing import TYPE_CHECKING

from porter.recipe import conditions, modular
from porter.recipe.inputs import INPUTS, as_tensor, load_input, load_latents

if TYPE_CHECKING:
    from porter.recipe import Recipe

#: recipe setting (generate.KEY) -> the names pipelines give it, the first one found
#: in the signature wins
NAMES = {
    "prompt": ("prompt",),
    "negative_prompt": ("negative_prompt",),
    "height": ("height",),
    "width": ("width",),
    "frames": ("num_frames", "video_length", "frames"),
    "steps": ("num_inference_steps",),
    "timesteps": ("timesteps",),
    "sigmas": ("sigmas",),
    "guidance_scale": ("guidance_scale",),
    "guidance_scale_2": ("guidance_scale_2",),
    "max_sequence_length": ("max_sequence_length",),
    "image": ("image",),
    "last_image": ("last_image",),
    "video": ("video", "driving_video"),  # Wan Animate 2: the motion to follow
    "mask": ("mask", "mask_video"),
    "control_video": ("control_video", "conditioning_frames"),
    "pose_video": ("pose_video",),
    "face_video": ("face_video",),
    "background_video": ("background_video",),
    "latents": ("latents",),
    "conditions": ("conditions",),
    "reference_conditions": ("reference_conditions",),
}
#: the pipeline call's own business: never a recipe setting or an extra
RESERVED = ("generator", "output_type", "return_dict", "callback_on_step_end",
            "callback_on_step_end_tensor_inputs")


def signature(cls) -> inspect.Signature:
    """The pipeline call's signature, its annotations resolved where they are strings
    (a module with ``from __future__ import annotations``) and resolve."""
    try:
        return inspect.signature(cls.__call__, eval_str=True)
    except Exception:  # a name only imported for type checkers: the strings stay
        return inspect.signature(cls.__call__)


def parameters(cls) -> dict[str, inspect.Parameter] | None:
    """The call's named parameters (None when it takes ``**kwargs``: anything goes); a
    modular pipeline's are its blocks' inputs (``porter.recipe.modular``)."""
    if modular.is_modular(cls):
        return modular.parameters(cls)
    found = signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in found.values()):
        return None
    return {name: p for name, p in found.items() if name != "self"}


def tensor_only(annotation) -> bool:
    """Does a call argument take only tensors (no images), by its annotation?"""
    import torch

    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    members = [m for m in (typing.get_args(annotation) if union else (annotation,))
               if m is not type(None)]
    return bool(members) and all(
        isinstance(m, type) and (issubclass(m, torch.Tensor) or m.__module__ == "torch"
                                 and m.__name__.endswith("Tensor")) for m in members)


def _annotation(taken, name: str):
    """The annotation of the call's argument ``name`` (none for a ``**kwargs`` call)."""
    return taken[name].annotation if taken is not None else inspect.Parameter.empty


def _name(key: str, taken) -> str | None:
    return next((name for name in NAMES[key] if taken is None or name in taken), None)


def wanted(recipe: Recipe) -> list[str]:
    """The settings this recipe passes: those it sets."""
    gen = recipe.generate
    return [key for key in NAMES
            if recipe.sets(f"generate.{key}") and getattr(gen, key) is not None]


def problems(recipe: Recipe, cls) -> list:
    """Settings and extras the pipeline ``cls`` does not take, and arguments it needs
    that the recipe does not give, each with a hint."""
    taken = parameters(cls)
    found = [problem for key in conditions.KEYS if key in wanted(recipe)
             and (taken is None or key in taken)
             for problem in conditions.problems(recipe, cls.__name__,
                                                _annotation(taken, key), key)]
    if taken is None:
        return found
    accepted = ", ".join(n for n in taken if n not in RESERVED)
    for key in wanted(recipe):
        if _name(key, taken) is None:
            names = " or ".join(NAMES[key])
            hint = f"leave generate.{key} out; it takes: {accepted}"
            if key in ("timesteps", "sigmas"):  # the pipeline's own loop sets its schedule
                hint = ("a generic pipeline runs its own loop, which spreads "
                        "generate.steps itself; the model's staged family (wan, "
                        "cogvideox, hunyuan) sets the schedule on the scheduler")
            found.append(recipe.problem(
                f"generate.{key}", f"{cls.__name__} takes no {names} argument", hint=hint))
    mapped = {_name(key, taken): key for key in NAMES if _name(key, taken)}
    given = {_name(key, taken) for key in wanted(recipe)} | set(recipe.generate.extra)
    for name, parameter in taken.items():
        if parameter.default is not inspect.Parameter.empty or name in given \
                or parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        if name in RESERVED:  # the one problem worth saying
            return [recipe.problem("model.pipeline", f"{cls.__name__} needs {name}, "
                                   "which Porter's run sets itself",
                                   hint="Porter runs pipelines whose call takes its "
                                   "generator and output type as diffusers' do")]
        elif name in mapped:
            found.append(recipe.problem(f"generate.{mapped[name]}", f"{cls.__name__} needs "
                                        f"{name}", hint=f"set generate.{mapped[name]}"))
        else:
            found.append(recipe.problem("generate.extra", f"{cls.__name__} needs {name}",
                                        hint=f"set generate.extra.{name}"))
    for key in recipe.generate.extra:
        if key in mapped:
            found.append(recipe.problem(f"generate.extra.{key}", f"{key} is set by "
                                        f"generate.{mapped[key]}",
                                        hint=f"set generate.{mapped[key]} instead"))
        elif key in RESERVED:
            found.append(recipe.problem(f"generate.extra.{key}", f"{key} is set by Porter",
                                        hint="leave it out"))
        elif key not in taken:
            close = difflib.get_close_matches(key, [n for n in taken if n not in RESERVED],
                                              n=1)
            found.append(recipe.problem(
                f"generate.extra.{key}", f"{cls.__name__} takes no argument {key!r}",
                hint=f"did you mean {close[0]!r}?" if close else f"it takes: {accepted}"))
    return found


def kwargs(recipe: Recipe, cls) -> dict:
    """The call's keyword arguments: each setting under this pipeline's name for it,
    the seed as a generator, then ``generate.extra``."""
    import torch

    taken, gen = parameters(cls), recipe.generate
    call = {}
    for key in wanted(recipe):
        name = _name(key, taken)
        if name is None:
            continue  # validate refused it; a pipeline with **kwargs takes the first name
        value = getattr(gen, key)
        if key in INPUTS:
            value = load_input(key, recipe.file_path(f"generate.{key}", value))
            if taken is not None and tensor_only(taken[name].annotation):
                value = as_tensor(value, mask=key == "mask")
        elif key in conditions.KEYS:
            value = conditions.objects(recipe, cls.__name__, _annotation(taken, key), key)
        elif key == "latents":
            value = load_latents(recipe.file_path("generate.latents", value))
        call[name] = value
    mask, video = call.get(_name("mask", taken)), call.get(_name("video", taken))
    if isinstance(mask, torch.Tensor) and isinstance(video, torch.Tensor) \
            and mask.shape[2] == 1:  # one image masks every frame of the video
        call[_name("mask", taken)] = mask.expand(-1, -1, video.shape[2], -1, -1)
    if taken is None or "generator" in taken:
        call["generator"] = torch.Generator("cpu").manual_seed(gen.seed)
    return {**call, **gen.extra}
