"""A family whose generation the core's loop drives (``porter.generate.stages``).

``StagedFamily`` declares what the loop needs to know (``Grid``: how its models divide
a video; the conditioning entries each guidance branch takes; the inputs and
``generate.extra`` keys it reads; its pipeline's default text length) and checks every
recipe against it once, here. A plugin adds the steps that differ, each mirroring a
piece of the pipeline's ``__call__`` so that a run and a plain diffusers run from the
same seed agree: ``encode``, ``initial_latents``, ``timesteps``, ``call`` (one
transformer call) and ``decode``; ``denoiser``, ``model_input``, ``step`` and
``final_latents`` where the defaults do not fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from porter.errors import Problem
from porter.families.base import ModelFamily
from porter.recipe.inputs import INPUTS, PATH_KEYS

if TYPE_CHECKING:
    from porter.recipe import Recipe


@dataclass(frozen=True)
class Grid:
    """How a model divides a video: ``temporal * n + 1`` frames; latents ``temporal``
    times fewer frames and ``spatial`` times smaller in height and width, cut into
    patches of ``patch`` latents across."""

    temporal: int
    spatial: int
    patch: int = 1

    @property
    def pixels(self) -> int:
        """Height and width are multiples of this."""
        return self.spatial * self.patch

    def latents(self, recipe: Recipe) -> tuple[int, int, int]:
        """The recipe's latent frames, height and width."""
        gen = recipe.generate
        return ((gen.frames - 1) // self.temporal + 1, gen.height // self.spatial,
                gen.width // self.spatial)

    def tokens(self, recipe: Recipe) -> tuple[int, int, int]:
        """The transformer's video tokens as a grid (frames, height, width): the
        latents cut into patches (one latent frame deep)."""
        frames, height, width = self.latents(recipe)
        return frames, height // self.patch, width // self.patch

    def problems(self, recipe: Recipe, model: str) -> list[Problem]:
        """Heights and widths the patches do not divide, frame counts the VAE does not
        take (``model`` names the model in the messages)."""
        gen, found, step = recipe.generate, [], self.pixels
        for key in ("height", "width"):
            value = getattr(gen, key)
            if value % step:
                fits = sorted({value - value % step or step, value + step - value % step})
                fit = " or ".join(str(v) for v in fits)
                found.append(recipe.problem(
                    f"generate.{key}", f"{model} needs a multiple of {step}, got {value}",
                    hint=f"try {fit} (the VAE downsamples by {self.spatial}, patches are "
                         f"{self.patch} wide)"))
        if (gen.frames - 1) % self.temporal:
            below = gen.frames - (gen.frames - 1) % self.temporal
            found.append(recipe.problem(
                "generate.frames", f"{model} needs {self.temporal}n+1 frames, got "
                f"{gen.frames}", hint=f"try {below} or {below + self.temporal} (the VAE "
                f"compresses time by {self.temporal})"))
        return found


def from_the_start(scheduler) -> None:
    """Fix the scheduler's start index at its first timestep: ``scheduler.step`` then
    needs no value-dependent lookup of the timestep, which a traced value cannot answer
    (a scheduler without ``set_begin_index`` looks nothing up)."""
    if hasattr(scheduler, "set_begin_index"):
        scheduler.set_begin_index(0)


class StagedFamily(ModelFamily):
    staged = True
    previews = True  # (batch, channels, frames, height, width) latents; see the base
    #: the models' name in messages ("Wan needs 4n+1 frames")
    title: str = ""
    required = ("prompt", "height", "width", "frames", "steps")
    #: input files (``porter.recipe.inputs.INPUTS``) the family reads (its checks say
    #: when); any other is refused
    inputs: tuple[str, ...] = ("image", "last_image")
    #: ``generate.extra`` keys the family reads (its pipeline's own arguments, such as
    #: CogVideoX's ``use_dynamic_cfg``); any other is refused, not ignored
    extra: tuple[str, ...] = ()
    #: text tokens per prompt when the recipe does not set generate.max_sequence_length
    #: (the pipeline's own default); None: the recipe's value
    text_tokens: int | None = None
    #: conditioning entries of the conditional branch -> the unconditional branch's
    #: (``porter.generate.guidance`` hands ``call`` one side, or both batched); ``encode``
    #: leaves the unconditional ones out when the recipe does not guide
    guidance_pairs: dict[str, str] = {"prompt": "negative"}
    #: conditioning entries that are embeddings: ``dtypes.text_embeddings`` casts these;
    #: the rest (masks, image latents) keep their dtype
    embedding_keys: tuple[str, ...] = ("prompt", "negative")

    # ------------------------------------------------------------------ what it reads

    def grid(self, recipe: Recipe) -> Grid | None:
        """How the recipe's model divides a video (None: not known without its
        configuration; the size checks wait for the run)."""
        return None

    def extra_keys(self, recipe: Recipe) -> tuple[str, ...]:
        """The ``generate.extra`` keys this recipe's model reads."""
        return self.extra

    def check(self, recipe: Recipe) -> list[Problem]:
        """The shared checks: inputs and extra keys the family does not read, sizes its
        ``grid`` does not take."""
        gen = recipe.generate
        model_problems = super().check(recipe)  # an unknown variant: no grid to check by
        problems = list(model_problems)
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
        grid = None if model_problems else self.grid(recipe)
        return problems + (grid.problems(recipe, self.title) if grid is not None else [])

    def latent_grid(self, recipe: Recipe) -> tuple[int, int, int]:
        """The recipe's latent frames, height and width (``grid``)."""
        return self.grid(recipe).latents(recipe)

    def token_grid(self, recipe: Recipe) -> tuple[int, int, int] | None:
        """The transformer's video tokens (frames, height, width) for ``attention.window``
        (None: the family's attention is not windowed)."""
        grid = self.grid(recipe) if self.windows else None
        return None if grid is None else grid.tokens(recipe)

    def text_length(self, recipe: Recipe) -> int:
        """Text tokens per prompt: the recipe's, or the pipeline's own default."""
        if self.text_tokens is None or recipe.sets("generate.max_sequence_length"):
            return recipe.generate.max_sequence_length
        return self.text_tokens

    # ------------------------------------------------------------------ the steps

    def encode(self, pipe, recipe: Recipe) -> dict[str, Any]:
        """The conditioning on the JAX device (runs inside the torchax env): text
        embeddings by ``guidance_pairs``' keys, and whatever else ``call`` needs."""
        raise NotImplementedError

    def initial_latents(self, pipe, recipe: Recipe, generator):
        """The initial noise as a CPU torch tensor, drawn from ``generator`` (the run's
        CPU generator, seeded with ``generate.seed``) as the pipeline draws it: the same
        on every platform."""
        raise NotImplementedError

    def timesteps(self, pipe, recipe: Recipe):
        """Prepare ``pipe.scheduler`` and return the timesteps to iterate."""
        raise NotImplementedError

    def cfg_scale(self, recipe: Recipe) -> float:
        """The classifier-free guidance scale the recipe asks for: above 1, both branches
        run (a guidance-distilled model that takes its scale as an input says 1 unless
        the recipe asks for true guidance too)."""
        return recipe.generate.guidance_scale

    def denoiser(self, pipe, timestep, sampling, recipe: Recipe):
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
        when ``porter.generate.guidance`` batches both branches). ``branch``: the entries
        of ``guidance_pairs``' keys for this call (the conditional or unconditional
        ones, or both concatenated); ``conditioning``: everything ``encode`` made."""
        raise NotImplementedError

    def step(self, pipe, noise, timestep, latents, sampling):
        """The scheduler's step from the guided prediction to the next latents."""
        return pipe.scheduler.step(noise, timestep, latents, return_dict=False)[0]

    def final_latents(self, pipe, latents, conditioning: dict):
        """The latents after the last step, as the pipeline hands them to the VAE
        (a family that keeps given frames apart puts them back here)."""
        return latents

    def decode(self, pipe, latents, recipe: Recipe) -> np.ndarray:
        """Latents (CPU torch tensor) to frames: uint8 array (frames, height, width, 3)."""
        raise NotImplementedError

    def decode_chunks(self, pipe, latents, recipe: Recipe):
        """``decode``'s frames in time order, in the chunks the VAE makes them (uint8
        arrays, each (frames, height, width, 3)), so a stream can show the first before
        the last is made; together exactly ``decode``'s frames. Here: the whole decode
        as one chunk (a family whose VAE decodes in time order yields each as it has it)."""
        yield self.decode(pipe, latents, recipe)
