"""What a plugin teaches the core about one model family.

``ModelFamily`` is what every family declares: how a recipe becomes a diffusers
pipeline (tiny, local or hub), its checks, configurations, shapes, rotary tables,
plan estimates and compiled programs. How it generates is one of two
(``staged``; ``porter.generate.runners`` runs either):

- ``StagedFamily``: the core's loop (``porter.generate.stages``) drives the steps the family
  splits generation into (encode, initial latents, timesteps, one transformer call,
  the scheduler step, decode) and owns guidance (``porter.generate.guidance``), stages,
  checkpoints and resuming. Wan, CogVideoX and HunyuanVideo are staged.
- ``porter.families.generic.GenericFamily``: the pipeline's own ``__call__``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from porter.errors import Problem
from porter.recipe.inputs import INPUTS, PATH_KEYS


class ModelFamily:
    #: name recipes use in ``model.family``
    name: str = ""
    #: one line shown by ``porter plugins``
    summary: str = ""
    #: layouts ``build_tiny`` can build (``model.variant``); the first is the default
    variants: tuple[str, ...] = ()
    #: True: the core's loop drives the family's steps (``StagedFamily``); False: the
    #: pipeline's own ``__call__`` runs (``GenericFamily``). A plugin subclasses one of the
    #: two, which set it
    staged: bool | None = None
    #: generate settings the family cannot run without (the schema leaves them optional:
    #: a generic pipeline may take no prompt); checked before ``check``
    required: tuple[str, ...] = ()
    #: registered patches every run of this family gets, to trace or to run fast
    #: (applied before the recipe's)
    required_patches: tuple[str, ...] = ()
    #: the registered patch that serves rotary tables from the cache, if any
    rotary_patch: str | None = None
    #: True: the transformers' block lists run one after another, each block's outputs
    #: the next one's first inputs, so each list compiles as one scan over its blocks
    #: (``compile.<component>.scan`` in a recipe decides otherwise)
    scan_blocks: bool = False
    #: pipeline components compiled with jax.jit, and which of their methods
    compiled: dict[str, tuple[str, ...]] = {"transformer": ("forward",), "vae": ("decode",)}
    #: the transformer components whose steps ``transformer_steps`` counts (a step
    #: cache is refused on one it does not)
    stepped_transformers: tuple[str, ...] = ("transformer",)

    def starter_model(self) -> dict:
        """``model:`` keys (besides family) that `porter new` writes, as YAML text."""
        return {"source": "tiny", "dtype": "float32"}

    def starter_generate(self) -> dict:
        """``generate:`` values that `porter new` writes."""
        return {"prompt": "a red fox running through fresh snow", "negative_prompt": "",
                "height": 64, "width": 64, "frames": 17, "steps": 4, "guidance_scale": 5.0,
                "seed": 0}

    def rotary_patch_for(self, recipe) -> str | None:
        """The rotary patch for this recipe's model (families with several layouts)."""
        return self.rotary_patch

    def check(self, recipe) -> list[Problem]:
        """Problems a recipe has for this family, found without weights."""
        variant = recipe.model.variant
        if recipe.model.config and recipe.model.source != "tiny":
            return [recipe.problem("model.config", "model.config overrides a tiny model's "
                                   "configuration; a checkpoint's comes from its "
                                   "configuration files, which it would not change",
                                   hint="leave model.config out, or set model.source: tiny "
                                   "with the checkpoint's widths and the layers you want")]
        if variant is not None and recipe.model.source != "tiny":
            return [recipe.problem("model.variant", "a variant picks the layout of a tiny "
                                   "model; a checkpoint's layout comes from its "
                                   "configuration files", hint="leave model.variant out "
                                   "(or set model.source: tiny)")]
        if variant is not None and variant not in self.variants:
            return [recipe.problem("model.variant", f"family {self.name!r} has no variant "
                                   f"{variant!r}", hint="variants: "
                                   + (", ".join(self.variants) or "none"))]
        return []

    def pipeline_class(self, recipe=None) -> type:
        """The diffusers pipeline class used to load the recipe's checkpoint."""
        raise NotImplementedError

    def official_configs(self, source: str) -> dict | None:
        """Component -> (library, class name, config) for a hub id the plugin knows.

        Lets real-size recipes be validated and planned without weights.
        """
        return None

    def build_tiny(self, recipe) -> Any:
        """A small random-weight pipeline built in code (``model.source: tiny``)."""
        raise NotImplementedError

    def transformer_steps(self, pipe, recipe) -> dict[str, int]:
        """How many denoising steps each transformer component runs (a step cache
        aims at it): every step, the one transformer, unless the family says
        otherwise."""
        return {"transformer": recipe.generate.steps}

    def transformer_inputs(self, recipe, config) -> dict[str, tuple[int, ...]]:
        """Shapes of the transformer's keyword inputs for this recipe (for sharding checks).

        ``config`` is the transformer's configuration (from weights or a meta model).
        """
        return {}

    def rotary_tables(self, pipe, recipe) -> list:
        """Rotary tables for the recipe's shapes, computed on the host.

        Returns ``(module, key, tables, dtype)`` entries: ``module`` is the rotary
        module whose forward ``rotary_patch`` replaces, ``key`` the shape key
        that forward looks up, ``tables`` host tensors, ``dtype`` their cast.
        """
        return []

    def size_problems(self, recipe, config) -> list[Problem]:
        """Sizes (frames, height, width) the transformer with ``config`` cannot take:
        beyond its positional tables, or other than a fixed size it was trained at.
        Found without weights, before a run loads them."""
        return []

    def estimates(self, recipe, config) -> dict:
        """Analytic costs of one denoising step from the transformer's config.

        Keys: ``tokens``, ``flops_per_step`` (every guidance pass), ``attention``:
        the shapes attention runs at, as (batch, heads, q_len, k_len) tuples, and
        ``activations``: the widest activations as (batch, tokens, width) tuples.
        """
        return {}

    def programs(self, recipe, modules: dict) -> list | None:
        """The compiled programs one video runs, at the recipe's shapes: a list of
        ``porter.aot.programs.Program`` (component, method, the ``Input``s and static
        values it is called with, calls per video), in the order a run calls them.
        ``modules``: the components on the meta device (configurations, no weights).
        None: the family cannot say before running (``porter compile`` reports it).
        A test should hold them to what a run calls (``porter.aot.programs.recorded``)."""
        return None


class StagedFamily(ModelFamily):
    """A family whose generation the core's loop drives (``porter.generate.stages``): each method
    mirrors a piece of the pipeline's ``__call__``, so a run and a plain diffusers run
    from the same seed agree."""

    staged = True
    #: conditioning entries that are embeddings: ``dtypes.text_embeddings`` casts these;
    #: the rest (masks, image latents) keep their dtype
    embedding_keys: tuple[str, ...] = ("prompt", "negative")
    #: conditioning entries of the conditional branch -> the unconditional branch's
    #: (``porter.generate.guidance`` hands ``call`` one side, or both batched); ``encode`` leaves
    #: the unconditional ones out when the recipe does not guide
    guidance_pairs: dict[str, str] = {"prompt": "negative"}
    required = ("prompt", "height", "width", "frames", "steps")
    #: input files (``porter.recipe.inputs.INPUTS``) the family reads (its checks say when);
    #: any other is refused
    inputs: tuple[str, ...] = ("image", "last_image")

    def extra_keys(self, recipe) -> tuple[str, ...]:
        """``generate.extra`` keys this family reads (its pipeline's own arguments, such
        as CogVideoX's ``use_dynamic_cfg``); any other is refused, not ignored."""
        return ()

    def check(self, recipe) -> list[Problem]:
        gen = recipe.generate
        problems = super().check(recipe)
        for key in (*INPUTS, *PATH_KEYS):
            if key not in self.inputs and getattr(gen, key) is not None:
                problems.append(recipe.problem(
                    f"generate.{key}", f"family {self.name!r} takes no input {key}",
                    hint="leave it out, or run the pipeline that takes it with "
                    "model.family: generic (see docs/pipelines.md)"))
        known = self.extra_keys(recipe)
        for key in sorted(set(recipe.generate.extra) - set(known)):
            problems.append(recipe.problem(
                f"generate.extra.{key}", f"family {self.name!r} reads no {key!r} from "
                "generate.extra", hint="it reads: " + (", ".join(known) or "none")))
        return problems

    def encode(self, pipe, recipe) -> dict[str, Any]:
        """Text conditioning on the JAX device (runs inside the torchax env)."""
        raise NotImplementedError

    def initial_latents(self, pipe, recipe, generator):
        """The initial noise as a CPU torch tensor, drawn from ``generator`` (the run's
        CPU generator, seeded with ``generate.seed``) as the pipeline draws it: the same
        on every platform."""
        raise NotImplementedError

    def timesteps(self, pipe, recipe):
        """Prepare ``pipe.scheduler`` and return the timesteps to iterate."""
        raise NotImplementedError

    def cfg_scale(self, recipe) -> float:
        """The classifier-free guidance scale the recipe asks for: above 1, both branches
        run (a guidance-distilled model that takes its scale as an input says 1 unless
        the recipe asks for true guidance too)."""
        return recipe.generate.guidance_scale

    def denoiser(self, pipe, timestep, sampling, recipe):
        """The transformer that predicts this step and its guidance scale (two experts
        switch at a boundary; a schedule may vary the scale). ``sampling``:
        ``porter.generate.sampling.Sampling`` (the step's index, the schedule)."""
        return pipe.transformer, recipe.generate.guidance_scale

    def model_input(self, pipe, latents, timestep, conditioning: dict, model):
        """The transformer's latent input for one branch (given frames or image latents
        joined to the noise, in the transformer's dtype)."""
        return latents.to(model.dtype)

    def call(self, model, model_input, timestep, branch: dict, conditioning: dict):
        """One transformer call: the noise prediction for ``model_input`` (batch 1, or 2
        when ``porter.generate.guidance`` batches both branches). ``branch``: the entries of
        ``guidance_pairs``' keys for this call (the conditional or unconditional ones,
        or both concatenated); ``conditioning``: everything ``encode`` made."""
        raise NotImplementedError

    def step(self, pipe, noise, timestep, latents, sampling):
        """The scheduler's step from the guided prediction to the next latents."""
        return pipe.scheduler.step(noise, timestep, latents, return_dict=False)[0]

    def final_latents(self, pipe, latents, conditioning: dict):
        """The latents after the last step, as the pipeline hands them to the VAE
        (a family that keeps given frames apart puts them back here)."""
        return latents

    def decode(self, pipe, latents, recipe) -> np.ndarray:
        """Latents (CPU torch tensor) to frames: uint8 array (frames, height, width, 3)."""
        raise NotImplementedError
