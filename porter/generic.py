"""``model.family: generic``: any diffusers video pipeline from its recipe alone.

No stage knowledge: the pipeline's own ``__call__`` runs inside the torchax
environment with its components ported by the recipe (sharding, dtypes,
patches, attention, compile). What a model needs beyond that (a function that
cannot be traced, a table built in forward) is a patch: see
docs/authoring-recipes.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from porter import runners
from porter.recipe import call_args
from porter.errors import UsageError
from porter.family import ModelFamily


class _StepWatch:
    """The pipeline's own step callback (``callback_on_step_end``, which diffusers
    pipelines call with the latents after each step): stops a run whose latents go
    NaN or infinite at that step (not after decoding a black video), and keeps the
    last latents, the run's final ones; stops at a step end when a stop is requested
    (``interrupt.request_stop``: the job starts over when the server restarts). Not every pipeline has the callback:
    ``kwargs`` is then empty and ``latents`` stays None."""

    def __init__(self, pipe, total: int):
        import inspect

        self.total, self.latents = total, None
        self.kwargs = {}
        if "callback_on_step_end" in inspect.signature(type(pipe).__call__).parameters \
                and "latents" in getattr(pipe, "_callback_tensor_inputs", ()):
            self.kwargs = {"callback_on_step_end": self,
                           "callback_on_step_end_tensor_inputs": ["latents"]}

    def __call__(self, pipe, step, timestep, tensors):
        from porter import finite, interrupt
        from porter.stages import NonFinite

        if interrupt.requested():  # a server shutting down: no checkpoint to keep here
            raise interrupt.Interrupted(interrupt.requested())
        if not finite.on_device(tensors["latents"]):
            raise NonFinite(step + 1, self.total, None, staged=False)
        self.latents = tensors["latents"]
        return tensors


class GenericFamily(ModelFamily):
    name = "generic"
    summary = "any diffusers video pipeline, run by its own __call__ (no plugin needed)"
    runner = runners.PIPELINE
    # the VAE's decode too: a VAE that cannot be traced whole is split automatically
    compiled = {"transformer": ("forward",), "vae": ("decode",)}

    def starter_model(self):
        return {"source": "path/to/saved/pipeline   # a diffusers directory or hub id",
                "pipeline": "null              # e.g. LTXPipeline; default: model_index.json",
                "dtype": "float32"}

    def check(self, recipe):
        problems = super().check(recipe)
        if recipe.model.source == "tiny":
            problems.append(recipe.problem("model.source", "the generic family has no tiny "
                                           "model", hint="point model.source at a saved "
                                           "diffusers pipeline or a hub id"))
        if recipe.model.pipeline is not None:
            try:
                self.pipeline_class(recipe)
            except UsageError as exc:
                problems.append(recipe.problem("model.pipeline", exc.message, hint=exc.hint))
                return problems
        cls = self.concrete_class(recipe)
        if cls is not None:
            problems += call_args.problems(recipe, cls)
        return problems

    def concrete_class(self, recipe):
        """The pipeline class that will run, where known without loading: the recipe's
        ``model.pipeline``, or the one a local checkpoint's model_index.json names."""
        import json

        import diffusers

        from porter.recipe.sources import source_kind
        if recipe.model.pipeline is not None:
            return self.pipeline_class(recipe)
        if source_kind(recipe.model.source) != "local":
            return None
        try:
            index = json.loads((Path(recipe.model.source).expanduser() / "model_index.json")
                               .read_text())
            cls = getattr(diffusers, index["_class_name"], None)
        except (OSError, ValueError, KeyError, TypeError):
            return None  # the checkpoint checks say what is wrong with the file
        return cls if isinstance(cls, type) else None

    def pipeline_class(self, recipe=None):
        import diffusers

        name = recipe.model.pipeline if recipe is not None else None
        if name is None:
            return diffusers.DiffusionPipeline  # the class named in model_index.json
        cls = getattr(diffusers, name, None)  # only diffusers' own names: no arbitrary import
        if not (isinstance(cls, type) and issubclass(cls, diffusers.DiffusionPipeline)):
            raise UsageError(f"{name!r} is not a diffusers pipeline class",
                             hint="e.g. LTXPipeline, CogVideoXPipeline")
        return cls

    def call_kwargs(self, recipe, cls) -> dict:
        """Keyword arguments of the pipeline call (``porter.recipe.call_args``); families
        built on this one add or drop their own."""
        return call_args.kwargs(recipe, cls)

    def generate(self, pipe, recipe):
        watch = _StepWatch(pipe, recipe.generate.steps)
        out = pipe(output_type="np", **self.call_kwargs(recipe, type(pipe)), **watch.kwargs)
        frames = out.frames[0]
        frames = np.asarray(frames.jax() if hasattr(frames, "jax") else frames)
        return (frames * 255).round().clip(0, 255).astype("uint8"), watch.latents
