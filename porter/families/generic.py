"""``model.family: generic``: any diffusers video pipeline from its recipe alone.

No stage knowledge: the pipeline's own ``__call__`` runs inside the torchax
environment with its components ported by the recipe (sharding, dtypes,
patches, attention, compile). What a model needs beyond that (a function that
cannot be traced, a table built in forward) is a patch: see
docs/authoring-recipes.md.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from porter.errors import Interrupted, NonFinite, UsageError
from porter.families import chunked, far, wan_vae, width
from porter.families.base import Handover, ModelFamily, as_uint8, first_of
from porter.recipe import call_args, modular
from porter.recipe.inputs import INPUTS, KIND_NAMES, latents_names
from porter.recipe.sources import source_kind
from porter.runtime import finite, interrupt

if TYPE_CHECKING:
    from porter.recipe import Recipe

#: diffusers pipelines Porter cannot run from a recipe, and why (``porter validate``
#: refuses them; docs/pipelines.md is the whole list, tests/matrix proves it)
UNSUPPORTED: dict[str, str] = {
    # inputs no recipe key carries
    "Cosmos2_5_TransferPipeline": "its controls (a dict of control videos) have no recipe "
    "key, and its ControlNet needs torchvision",
    "LTX2DFRTemporalRefinePipeline": "it refines a DFR pass's latents, keyframe latents, "
    "keyframe positions and audio latents; a recipe gives latents only (generate.latents)",
    # broken in diffusers itself
    "EasyAnimateControlPipeline": "it fails in diffusers 0.42 itself: its call passes "
    "text_encoder_index to its own encode_prompt, which takes none",
}


#: pipelines whose step callback is broken in diffusers itself: Porter runs them without
#: watching their steps (no stop at the step whose latents go NaN; a server's shutdown
#: waits for the run's end; no final latents kept, so output.latents writes none)
UNWATCHED: dict[str, str] = {
    "LTXI2VLongMultiPromptPipeline": "its step callback writes the unpacked latents over "
    "the packed ones (any callback triggers it)",
}


def runnable(name: str) -> type:
    """diffusers' pipeline class ``name`` (a DiffusionPipeline, or a modular pipeline
    that makes video); UsageError saying why when Porter cannot run it (not a
    pipeline, a modular one making images, a placeholder for a missing library, or one
    in ``UNSUPPORTED``)."""
    import diffusers

    cls = getattr(diffusers, name, None)  # only diffusers' own names: no arbitrary import
    if isinstance(cls, type) and cls.__module__.startswith("diffusers.utils.dummy_"):
        needs = ", ".join(getattr(cls, "_backends", ())) or "more libraries"
        raise UsageError(f"{name} needs {needs}, and one of them is not installed here "
                         "(diffusers put a placeholder in its place)",
                         hint="install what is missing (e.g. opencv-python for opencv)")
    if modular.is_modular(cls):
        if cls is diffusers.ModularPipeline or cls.default_blocks_name is None:
            raise UsageError(f"{name} assembles no blocks of its own",
                             hint="name a model's modular pipeline, e.g. "
                             "WanModularPipeline")
        if "videos" not in modular.outputs(cls):
            raise UsageError(f"{name} makes {' and '.join(modular.outputs(cls))}, not "
                             "video", hint="Porter runs video pipelines")
    elif not (isinstance(cls, type) and issubclass(cls, diffusers.DiffusionPipeline)):
        raise UsageError(f"{name!r} is not a diffusers pipeline class",
                         hint="e.g. LTXPipeline, CogVideoXPipeline")
    if name in UNSUPPORTED:
        raise UsageError(f"{name}: {UNSUPPORTED[name]}",
                         hint="docs/pipelines.md lists the pipelines Porter runs")
    return cls


#: the names a pipeline gives its sound (Cosmos 3 Omni's is ``sound``)
SOUNDS = ("audio", "sound")


class Generated(NamedTuple):
    """What a pipeline's call made: frames (uint8), final latents (None where the
    pipeline hides them) and its waveform (None without sound), at ``sample_rate``
    where the call says it (else its components say it: ``porter.rundir.audio``)."""
    frames: np.ndarray
    latents: object
    waveform: object = None
    sample_rate: object = None


def first_video(out):
    """The frames of the first video in a pipeline's output: ``frames`` (a batch of
    videos; Sana-WM's is one video), ``video`` (Cosmos 3) or ``images``
    (Text2Video-Zero's frames)."""
    for name in ("frames", "video", "images"):
        video = getattr(out, name, None)
        if video is not None:
            break
    return first_of(video)


class _StepWatch:
    """The pipeline's own step callback (``callback_on_step_end``, which diffusers
    pipelines call with the latents after each step): stops a run whose latents go
    NaN or infinite at that step (not after decoding a black video), and keeps the
    last latents, the run's final ones; stops at a step end when a stop is requested
    (``interrupt.request_stop``: the job starts over when the server restarts). Not every
    pipeline has the callback, nor a working one (``UNWATCHED``): ``kwargs`` is then
    empty and ``latents`` stays None."""

    def __init__(self, pipe, total: int):
        import inspect

        self.total, self.latents = total, None
        self.kwargs = {}
        if type(pipe).__name__ in UNWATCHED:
            return
        if "callback_on_step_end" in inspect.signature(type(pipe).__call__).parameters \
                and "latents" in getattr(pipe, "_callback_tensor_inputs", ()):
            self.kwargs = {"callback_on_step_end": self,
                           "callback_on_step_end_tensor_inputs": ["latents"]}

    def __call__(self, pipe, step, timestep, tensors):

        # a server shutting down: no checkpoint to keep here (agreed: every process
        # stops at this step, or none)
        if signum := interrupt.agreed_request():
            raise Interrupted(signum)
        if not finite.bounded(size := finite.magnitude(tensors["latents"])):
            raise NonFinite(step + 1, self.total, None, staged=False, magnitude=size)
        self.latents = tensors["latents"]
        return tensors


class GenericFamily(ModelFamily):
    name = "generic"
    summary = "any diffusers video pipeline, run by its own __call__ (no plugin needed)"
    staged = False
    # the VAE's decode, and its encode where the VAE has ``_encode`` (which ``encode``
    # wraps in a distribution object); the text encoders and the image encoder (CLIP
    # or SigLIP vision), as the staged families compile theirs (a language model keeps
    # no key/value cache when compiled: ``jit.no_cache``). What cannot be traced whole
    # is split automatically
    compiled = {"transformer": ("forward",), "vae": ("decode", "_encode"),
                "text_encoder": ("forward",), "text_encoder_2": ("forward",),
                "image_encoder": ("forward",)}
    # a Wan VAE's frame by frame decode, for the pipelines that finish chunks (chunked.py);
    # AnyFlow FAR's fixed-size calls (far.py), compiled where a pipeline calls them
    compiled_functions = {"vae": {"decode_chunk": wan_vae.decode_chunk},
                          "transformer": {"far_step": far.step, "far_cache": far.cache}}

    starter_model = {"source": "path/to/saved/pipeline   # a diffusers directory or hub id",
                     "pipeline": "null              # e.g. LTXPipeline; default: "
                                 "model_index.json",
                     "dtype": "float32"}

    def check(self, recipe: Recipe):
        problems = super().check(recipe)
        if recipe.model.source == "tiny":
            problems.append(recipe.problem("model.source", "the generic family has no tiny "
                                           "model", hint="point model.source at a saved "
                                           "diffusers pipeline or a hub id"))
        where = "model.pipeline" if recipe.model.pipeline is not None else "model.source"
        try:
            cls = self.concrete_class(recipe)
        except UsageError as exc:
            return problems + [recipe.problem(where, exc.message, hint=exc.hint)]
        problems += self.input_problems(recipe)
        if cls is not None:
            problems += call_args.problems(recipe, cls) + far.problems(recipe, cls)
        return problems

    def input_problems(self, recipe: Recipe):
        """Input files (``generate.image``, ``video``, ..., ``latents``) that are not
        there."""
        found = []
        for key, kind in (*INPUTS.items(), ("latents", "latents")):
            value = getattr(recipe.generate, key)
            if value is not None and not recipe.file_path(f"generate.{key}", value).exists():
                what = {**KIND_NAMES, "latents": "a run's latents.safetensors"}[kind]
                found.append(recipe.problem(f"generate.{key}", f"no such file: {value}",
                                            hint=f"give {what} ("
                                            + recipe.relative_paths(f"generate.{key}") + ")"))
            elif value is not None and kind == "latents":
                try:  # its header only: the tensor is read when the run starts
                    latents_names(recipe.file_path("generate.latents", value))
                except UsageError as exc:
                    found.append(recipe.problem("generate.latents", exc.message,
                                                hint=exc.hint))
        return found

    def concrete_class(self, recipe: Recipe):
        """The pipeline class that will run, where known without loading: the recipe's
        ``model.pipeline``, or the one a local checkpoint's model_index.json names.
        UsageError for a class Porter cannot run (``runnable``)."""
        import json

        if recipe.model.pipeline is not None or _modular_index(recipe) is not None:
            return self.pipeline_class(recipe)
        if source_kind(recipe.model.source) != "local":
            return None
        try:
            index = json.loads((Path(recipe.model.source).expanduser() / "model_index.json")
                               .read_text())
            name = index["_class_name"]
        except (OSError, ValueError, KeyError, TypeError):
            return None  # the checkpoint checks say what is wrong with the file
        return runnable(name) if isinstance(name, str) else None

    def pipeline_class(self, recipe: Recipe | None = None):
        import diffusers

        name = recipe.model.pipeline if recipe is not None else None
        if name is None and recipe is not None:
            name = _modular_index(recipe)
        if name is None:
            return diffusers.DiffusionPipeline  # the class named in model_index.json
        return runnable(name)

    def default_activations(self, recipe: Recipe, name: str, axes: dict,
                            config=None) -> list:
        """The residual of the transformers with Wan's blocks (AnyFlow FAR's, Helios's,
        SkyReels-V2's, Wan's own pipelines') split along its width under the head axis
        where their heads divide it (``width``)."""
        return width.width_split(recipe, self.concrete_class(recipe), axes,
                                 width.heads_of(config)) if name == "transformer" else []

    def default_inputs(self, recipe: Recipe, name: str, axes: dict, config) -> dict:
        """AnyFlow FAR's cache, its heads over the head axis (``far.cache_split``)."""
        return far.cache_split(recipe, self.concrete_class(recipe), axes, config) \
            if name == "transformer" else {}

    def decodes_in_chunks(self, recipe: Recipe) -> bool:
        cls = self.concrete_class(recipe)  # the recipe's, or the checkpoint's index's
        # a pipeline that finishes its chunks is decoded chunk by chunk where the run
        # takes its frames as they come (its stream), else whole at its end
        return cls is not None and (chunked.decodes_chunks(cls) or (
            recipe.output.streams and chunked.finishes_chunks(cls)))

    def call_kwargs(self, recipe: Recipe, cls) -> dict:
        """Keyword arguments of the pipeline call (``porter.recipe.call_args``); families
        built on this one add or drop their own."""
        return call_args.kwargs(recipe, cls)

    def generate(self, pipe, recipe: Recipe, on_frames=None) -> Generated:
        """The pipeline's call; every frame of its video handed to ``on_frames`` too,
        in order: as the pipeline finishes each chunk where it makes its video chunk by
        chunk (``porter.families.chunked``), else at its end."""
        if modular.is_modular(type(pipe)):
            made = self._generate_modular(pipe, recipe)
            Handover(on_frames).finish(made.frames)
            return made
        watch = _StepWatch(pipe, recipe.generate.steps)
        handover, watching = chunked.handed_on(pipe, on_frames)
        call = self.call_kwargs(recipe, type(pipe))
        with watching, far.fixed_size(pipe, call):
            out = pipe(output_type="np", **call, **watch.kwargs)
        frames = as_uint8(first_video(out))
        handover.finish(frames)
        return Generated(frames, watch.latents, _sound_of(vars(out)))

    def _generate_modular(self, pipe, recipe: Recipe):
        """A modular pipeline's call: its blocks run as diffusers runs them, the recipe's
        guidance scales set on its guiders for this call only. Its blocks have no step
        callback: no step is watched (as ``UNWATCHED``); the final latents, which its
        state keeps, are checked once the call ends."""
        cls = type(pipe)
        call = self.call_kwargs(recipe, cls)
        if "output_type" in call_args.parameters(cls):
            call["output_type"] = "np"
        guiders = modular.guided(cls)
        with _guided(pipe, {guiders[key]: call.pop(key) for key in list(call)
                            if key in guiders}):
            out = pipe(output=["videos", "latents", *SOUNDS, "sampling_rate"], **call)
        latents = out.get("latents")
        if latents is not None and not finite.bounded(size := finite.magnitude(latents)):
            steps = recipe.generate.steps or 0
            raise NonFinite(steps, steps, None, staged=False, magnitude=size)
        return Generated(as_uint8(first_of(out["videos"])), latents, _sound_of(out),
                         out.get("sampling_rate"))


def _sound_of(out: dict):
    """A pipeline output's sound, whatever the pipeline calls it (None: no sound)."""
    return next((out[name] for name in SOUNDS if out.get(name) is not None), None)


@contextlib.contextmanager
def _guided(pipe, scales: dict):
    """The pipeline's guiders with these guidance scales (guider name -> scale), its
    own guiders back afterwards: a port serves many calls."""
    kept = {name: getattr(pipe, name) for name in scales}
    pipe.update_components(**{name: guider.new(guidance_scale=scales[name])
                              for name, guider in kept.items()})
    try:
        yield
    finally:
        if kept:
            pipe.update_components(**kept)


def _modular_index(recipe: Recipe) -> str | None:
    """The modular pipeline class a local checkpoint's modular_model_index.json names
    (None: no such file, or a classic checkpoint beside it)."""
    if source_kind(recipe.model.source) != "local":
        return None
    root = Path(recipe.model.source).expanduser()
    if (root / "model_index.json").exists():
        return None
    return modular.class_name(root)
