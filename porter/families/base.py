"""What a plugin teaches the core about one model family: ``ModelFamily``.

A family is mostly declared: its name, its layouts, which components compile and how,
which patches every run needs. What cannot be declared is a few methods: how a recipe
becomes a diffusers pipeline (tiny, local or hub), the transformer's input shapes and
costs, its rotary tables and compiled programs, and the checks its models need beyond
the shared ones. How it generates is one of two (``staged``; ``porter.generate.runners``
runs either):

- ``porter.families.staged.StagedFamily``: the core's loop drives the few steps the
  family says (encode, the transformer call, decode, ...) and owns guidance, stages,
  checkpoints and resuming. Wan, CogVideoX and HunyuanVideo are staged.
- ``porter.families.generic.GenericFamily``: the pipeline's own ``__call__``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from porter.errors import Problem
from porter.runtime import notices

if TYPE_CHECKING:
    from porter.recipe import Recipe



def as_uint8(frames):
    """A video's frames in [0, 1] (numpy, or a torchax tensor) as uint8 pixels."""
    import numpy as np

    frames = np.asarray(frames.jax() if hasattr(frames, "jax") else frames)
    return (frames * 255).round().clip(0, 255).astype("uint8")


def first_of(video):
    """The first video of a batch of videos (a list, or a 5-D array), or ``video``
    itself when it is one."""
    batched = isinstance(video, (list, tuple)) or getattr(video, "ndim", 0) == 5
    return video[0] if batched else video


def decoded_frames(pipe, video):
    """A VAE's decoded pixels (a host tensor, -1..1, batch first) as the pipeline's
    video processor turns them into the first video's frames: uint8 (count, height,
    width, 3)."""
    return as_uint8(pipe.video_processor.postprocess_video(video.float(),
                                                           output_type="np")[0])


def compiled_function(component, name: str, function):
    """``component``'s compiled ``name`` (a family's ``compiled_functions``, as a run
    compiles them), or, where the component is not compiled, ``function`` on it as it
    is (eagerly). Asked of the component as an attribute: a wrapper around it
    (``attention.Skipped``) wraps its methods' calls too."""
    import functools

    compiled = getattr(component, name, None)
    return compiled if callable(compiled) else functools.partial(function, component)


def takes_frames(family) -> bool:
    """Does ``family.generate`` take ``on_frames`` (a plugin's written before it did
    hands its frames over at its end)?"""
    import inspect

    return "on_frames" in inspect.signature(family.generate).parameters


class Handover:
    """Frames handed on (``on_frames``, uint8 chunks in order) as a pipeline decodes
    them, each chunk's last ``hold`` frames kept back until the next one comes (what
    the pipeline may still trim from its video's end); ``finish(video)`` hands on the
    finished video's frames not handed on yet. So the frames handed on are the video's,
    whatever the pipeline trims; a pipeline that changed frames after decoding them is
    said in a warning (the stream then differs from the video). Only a digest of each
    chunk is kept to check that, not the frames."""

    def __init__(self, on_frames=None, hold: int = 0):
        self.on_frames, self.hold = on_frames, hold
        self.handed: list = []  # (frame count, digest) of each chunk handed on
        self.held = None

    @property
    def count(self) -> int:
        return sum(count for count, _ in self.handed)

    def add(self, frames) -> None:
        import numpy as np

        if self.held is not None:
            frames = np.concatenate([self.held, frames])
        cut = max(len(frames) - self.hold, 0)
        self.held = frames[cut:]
        if cut:
            self._hand_on(frames[:cut])

    def finish(self, video) -> None:
        at = 0
        for count, digest in self.handed:
            if _digest(video[at:at + count]) != digest:
                notices.warn("the frames handed on as the pipeline decoded them differ "
                             "from its finished video (it changed them afterwards): the "
                             "stream shows other frames than video.mp4")
                break
            at += count
        if len(video) > self.count:
            self._hand_on(video[self.count:])

    def _hand_on(self, frames) -> None:
        if self.on_frames is not None:
            self.handed.append((len(frames), _digest(frames)))
            self.on_frames(frames)


def _digest(frames) -> tuple:
    import hashlib

    import numpy as np

    return frames.shape, hashlib.blake2b(np.ascontiguousarray(frames).data).digest()


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
    #: component -> {name: function(module, ...)}: functions compiled as methods of the
    #: component beside ``compiled``'s (its weights the programs' inputs), called
    #: through ``compiled_function`` (a streamed decode's chunk, FAR's fixed-shape calls)
    compiled_functions: dict[str, dict] = {}
    #: the transformer components whose steps ``transformer_steps`` counts (a step
    #: cache is refused on one it does not)
    stepped_transformers: tuple[str, ...] = ("transformer",)
    #: the modules of those transformers whose (first) output is the video's tokens,
    #: (batch, tokens, width): with a mesh axis ``sp`` their outputs are split over it
    #: (sequence parallelism, ``porter.transforms.sharding.sequence_split``); None: the
    #: family does not say (a recipe with ``sp`` then gives its own activation rule)
    token_blocks: str | None = None

    def default_activations(self, recipe: Recipe, name: str, axes: dict,
                            config=None) -> list:
        """Activation rules of transformer ``name`` (``config``: its configuration, or
        None) where the recipe gives none and no token split applies
        (``porter.transforms.sharding.activation_rules``): none here; a family that
        knows a better split for its model says it."""
        return []

    def default_inputs(self, recipe: Recipe, name: str, axes: dict, config) -> dict:
        """Keyword inputs of transformer ``name`` (and of its compiled functions) placed
        on the mesh by spec where the recipe's ``sharding.inputs`` does not place them
        (``porter.transforms.sharding.input_specs``; ``config``: the transformer's,
        or None): none here; a family whose transformer takes a large input the
        compiler would otherwise hold whole on every device says how it splits."""
        return {}

    #: live previews (``porter.generate.preview``) while Porter's loop denoises: the
    #: family's latents are (batch, channels, frames, height, width) and its ``decode``
    #: takes any such latents; False: none (``output.preview_every`` is refused)
    previews: bool = False
    #: block-sparse video attention (``attention.window``): the transformer's
    #: self-attention runs over the video's tokens alone, in the grid's order, and
    #: ``token_grid`` says the grid; False: refused (text and video tokens attend
    #: together, or the pipeline runs its own loop)
    windows: bool = False
    #: component -> what renames the original release's keys to the library's for a
    #: file of its own (``model.transformer``, ``model.vae``, ``model.text_encoder``): the
    #: name of a function in ``diffusers.loaders.single_file_utils``, or a function
    #: (``{name: tensor} -> {name: tensor}``); absent: such a file must use the
    #: library's names
    single_file_converters: dict = {}
    #: the linear layers ``quantize`` takes by default (regexes over module names): those
    #: inside the block lists, less the modulation ones (AdaLayerNorm's ``norm*.linear``);
    #: embeddings, norms and the output projection stay in the model's dtype
    quantize_include: tuple[str, ...] = (r"\w*blocks\.\d+\..*",)
    quantize_exclude: tuple[str, ...] = (r".*norm.*",)

    #: ``model:`` keys (besides family) that `porter new` writes, as YAML text
    starter_model: dict = {"source": "tiny", "dtype": "float32"}
    #: ``generate:`` values that `porter new` writes
    starter_generate: dict = {"prompt": "a red fox running through fresh snow",
                              "negative_prompt": "", "height": 64, "width": 64,
                              "frames": 17, "steps": 4, "guidance_scale": 5.0, "seed": 0}
    #: the patches `porter new` lists: those every recipe of the family takes
    starter_patches: tuple[str, ...] = ()

    def rotary_patch_for(self, recipe: Recipe) -> str | None:
        """The rotary patch for this recipe's model (families with several layouts)."""
        return self.rotary_patch

    def token_grid(self, recipe: Recipe) -> tuple[int, int, int] | None:
        """The transformer's video tokens (frames, height, width) where ``windows``;
        None: not windowed, or not known without the model's configuration."""
        return None

    def check(self, recipe: Recipe) -> list[Problem]:
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

    def pipeline_class(self, recipe: Recipe | None = None) -> type:
        """The diffusers pipeline class used to load the recipe's checkpoint."""
        raise NotImplementedError

    def official_configs(self, source: str) -> dict | None:
        """Component -> (library, class name, config) for a hub id the plugin knows.

        Lets real-size recipes be validated and planned without weights.
        """
        return None

    def release(self, folder) -> dict | None:
        """An original release's folder (not a diffusers one) as ``model.source``: what
        ``porter.loading.release`` needs to stand a diffusers layout beside it, or None
        where the family does not know the folder. Keys: ``pipeline`` (diffusers class
        name), ``configs`` (component -> (library, class name, config)), ``scheduler``
        ((class name, config)), ``tokenizer`` (the tokenizer's folder), ``files``
        (component -> the weights' file, read as ``model.<component>``)."""
        return None

    def build_tiny(self, recipe: Recipe) -> Any:
        """A small random-weight pipeline built in code (``model.source: tiny``)."""
        raise NotImplementedError

    def transformer_steps(self, pipe, recipe: Recipe) -> dict[str, int]:
        """How many denoising steps each transformer component runs (a step cache
        aims at it): every step, the one transformer, unless the family says
        otherwise."""
        return {"transformer": recipe.generate.steps}

    def transformer_inputs(self, recipe: Recipe, config) -> dict[str, tuple[int, ...]]:
        """Shapes of the transformer's keyword inputs for this recipe (for sharding checks).

        ``config`` is the transformer's configuration (from weights or a meta model).
        """
        return {}

    def rotary_tables(self, pipe, recipe: Recipe) -> list:
        """Rotary tables for the recipe's shapes, computed on the host.

        Returns ``(module, key, tables, dtype)`` entries: ``module`` is the rotary
        module whose forward ``rotary_patch`` replaces, ``key`` the shape key
        that forward looks up, ``tables`` host tensors, ``dtype`` their cast.
        """
        return []

    def size_problems(self, recipe: Recipe, config) -> list[Problem]:
        """Sizes (frames, height, width) the transformer with ``config`` cannot take:
        beyond its positional tables, or other than a fixed size it was trained at.
        Found without weights, before a run loads them."""
        return []

    def estimates(self, recipe: Recipe, config) -> dict:
        """Analytic costs of one denoising step from the transformer's config.

        Keys: ``tokens``, ``flops_per_step`` (every guidance pass), ``attention``:
        the shapes attention runs at, as (batch, heads, q_len, k_len) tuples, and
        ``activations``: the widest activations as (batch, tokens, width) tuples.
        """
        return {}

    def decodes_in_chunks(self, recipe: Recipe) -> bool:
        """Does the recipe's pipeline make its video chunk by chunk, each chunk denoised
        and then decoded before the next (an autoregressive pipeline's own loop)? Its
        frames then stream as each chunk is decoded, and ``porter compile``'s stream
        bound counts one chunk's work before the first frames."""
        return False

    def programs(self, recipe: Recipe, modules: dict) -> list | None:
        """The compiled programs one video runs, at the recipe's shapes: a list of
        ``porter.aot.programs.Program`` (component, method, the ``Input``s and static
        values it is called with, calls per video), in the order a run calls them.
        ``modules``: the components on the meta device (configurations, no weights).
        None: the family cannot say before running (``porter compile`` reports it).
        A test should hold them to what a run calls (``porter.aot.programs.recorded``)."""
        return None
