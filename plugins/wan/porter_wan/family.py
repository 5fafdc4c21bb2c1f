"""Wan 2.1 and 2.2, split into the steps Porter drives.

Each step mirrors ``diffusers.WanPipeline.__call__`` (text-to-video) or
``WanImageToVideoPipeline.__call__`` (a first frame, optionally a last frame)
so that a Porter run and a plain diffusers run from the same seed give the same
latents. What differs between Wan models (experts, conditioning channels,
per-token timesteps, VAE) is read from their configuration (``Layout``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from porter import families as guidance
from porter.families.base import StagedFamily
from porter.loading.model_configs import cached_snapshot
from porter.shims.interop import to_host
from porter.transforms import rotary
from porter_wan.layout import Layout
from porter_wan.tiny import VARIANTS


class WanFamily(StagedFamily):
    name = "wan"
    summary = ("Wan 2.1 and 2.2: text-to-video, two-expert A14B (text and image), "
               "image-to-video, first-last-frame, TI2V-5B (text and image)")
    variants = tuple(VARIANTS)
    # Wan writes rotated q and k into strided slices: keep that out of a scatter
    rotary_patch = "wan.rope_cache"
    embedding_keys = ("prompt", "negative", "image_embeds")
    scan_blocks = True  # each block's output is the next one's input
    stepped_transformers = ("transformer", "transformer_2")  # two experts
    compiled = {"text_encoder": ("forward",), "image_encoder": ("forward",),
                "transformer": ("forward",), "transformer_2": ("forward",),
                "vae": ("decode", "_encode")}

    def pipeline_class(self, recipe=None):
        from diffusers import WanImageToVideoPipeline, WanPipeline
        given = recipe is not None and recipe.generate.image is not None
        return WanImageToVideoPipeline if given else WanPipeline

    def layout(self, recipe) -> Layout | None:
        """The recipe's model layout, from its configuration files (no weights read);
        None for a hub id Porter has no configuration for and the cache does not hold
        (the rules that need a layout wait for the run, which downloads it)."""
        from porter.recipe.sources import source_kind
        from porter_wan import tiny
        from porter_wan.configs import OFFICIAL, PIPELINE

        source = recipe.model.source
        kind = source_kind(source)
        try:
            if kind == "tiny":
                return tiny.layout(recipe.model.variant, dict(recipe.model.config))
            if kind == "local":
                return Layout.of_directory(Path(source).expanduser())
            if source in OFFICIAL:
                return Layout.of_official(OFFICIAL[source], PIPELINE.get(source, {}))
            cached = cached_snapshot(source)
            return None if cached is None else Layout.of_directory(cached)
        except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
            # configuration files that cannot be read as Wan's: the checks that build
            # the model from them say what is wrong; the layout rules wait
            return None

    def starter_generate(self):
        return {**super().starter_generate(), "max_sequence_length": 32}

    def official_configs(self, source):
        from porter_wan.configs import OFFICIAL
        return OFFICIAL.get(source)

    def build_tiny(self, recipe):
        from porter_wan.tiny import build
        return build(recipe.model.variant, image=recipe.generate.image is not None,
                     transformer_config_overrides=dict(recipe.model.config))

    def check(self, recipe):
        problems = super().check(recipe)
        if problems:  # an unknown variant: no layout to check against
            return problems
        if recipe.model.config:
            import inspect

            from diffusers import WanTransformer3DModel
            known = set(inspect.signature(WanTransformer3DModel.__init__).parameters) - {"self"}
            for key in sorted(set(recipe.model.config) - known):
                problems.append(recipe.problem(f"model.config.{key}", f"WanTransformer3DModel "
                                               f"has no argument {key!r}",
                                               hint="arguments: " + ", ".join(sorted(known))))
            if problems:
                return problems
        layout = self.layout(recipe)
        if layout is None:
            return problems
        return problems + self._size_rules(recipe, layout) + self._image_rules(recipe, layout) \
            + self._guidance_rules(recipe, layout)

    @staticmethod
    def _size_rules(recipe, layout):
        gen, problems, step = recipe.generate, [], layout.pixels_per_patch
        for key in ("height", "width"):
            value = getattr(gen, key)
            if value % step:
                fit = f"{value - value % step or step} or {value + step - value % step}"
                problems.append(recipe.problem(
                    f"generate.{key}", f"this Wan model needs a multiple of {step}, got "
                    f"{value}", hint=f"try {fit} (the VAE downsamples by {layout.spatial}, "
                    f"patches are {layout.patch} wide)"))
        if (gen.frames - 1) % layout.temporal:
            below = gen.frames - (gen.frames - 1) % layout.temporal
            problems.append(recipe.problem(
                "generate.frames", f"Wan needs {layout.temporal}n+1 frames, got {gen.frames}",
                hint=f"try {below} or {below + layout.temporal} (the VAE compresses time by "
                     f"{layout.temporal})"))
        return problems

    @staticmethod
    def _image_rules(recipe, layout):
        gen, problems = recipe.generate, []
        if layout.needs_image and gen.image is None:
            problems.append(recipe.problem(
                "generate.image", "this image-to-video model needs an image (its first frame)",
                hint="generate.image: path/to/first_frame.png"))
        if gen.image is not None and not layout.takes_image:
            problems.append(recipe.problem(
                "generate.image", "this text-to-video model takes no image",
                hint="leave generate.image out, or use an image-to-video model (tiny "
                     "variants: i2v, i2v-two-experts, ti2v, flf2v)"))
        if gen.last_image is not None:
            if gen.frames < layout.temporal + 1:
                problems.append(recipe.problem("generate.frames", f"a first and a last frame "
                                               f"need at least {layout.temporal + 1} frames",
                                               hint=f"frames: {layout.temporal + 1} or more"))
            if gen.image is None:
                problems.append(recipe.problem("generate.last_image", "a last frame needs a "
                                               "first frame", hint="set generate.image too"))
            elif not layout.takes_last_image:
                problems.append(recipe.problem(
                    "generate.last_image", "this model takes no last frame",
                    hint="leave generate.last_image out; first-last-frame models: Wan 2.1 "
                         "FLF2V, Wan 2.2 I2V-A14B (tiny variants flf2v, i2v-two-experts)"))
        elif layout.needs_last_image and gen.image is not None:
            problems.append(recipe.problem(
                "generate.last_image", "this first-last-frame model needs a last frame too",
                hint="generate.last_image: path/to/last_frame.png"))
        for key in ("image", "last_image"):
            value = getattr(gen, key)
            if value is not None and not recipe.file_path(f"generate.{key}", value).is_file():
                problems.append(recipe.problem(f"generate.{key}", f"{value!r} is not a file",
                                               hint="paths are relative to the recipe's folder"))
        return problems

    @staticmethod
    def _guidance_rules(recipe, layout):
        if recipe.generate.guidance_scale_2 is not None and layout.boundary_ratio is None:
            return [recipe.problem(
                "generate.guidance_scale_2", "only two-expert models (Wan 2.2 A14B) take a "
                "second guidance scale", hint="leave it out; guidance_scale applies to "
                "every step")]
        return []

    def encode(self, pipe, recipe):
        gen = recipe.generate
        prompt, negative = pipe.encode_prompt(
            gen.prompt, gen.negative_prompt, do_classifier_free_guidance=guidance.guided(self, recipe),
            max_sequence_length=gen.max_sequence_length, device="jax")
        dtype = self.experts(pipe)[0].dtype
        conditioning = {"prompt": prompt.to(dtype)}
        if negative is not None:
            conditioning["negative"] = negative.to(dtype)
        layout = Layout.of_pipe(pipe)
        if gen.image is not None:
            from porter_wan import i2v
            conditioning.update(i2v.conditioning(pipe, recipe, layout,
                                                 self._grid(recipe, layout)))
            if "image_embeds" in conditioning:
                conditioning["image_embeds"] = conditioning["image_embeds"].to(dtype)
        elif layout.expand_timesteps:  # text mode: every latent frame is denoised
            from porter_wan import i2v
            conditioning["frame_mask"] = i2v.frame_mask(self._grid(recipe, layout),
                                                        first_given=False).to("jax")
        return conditioning

    def _layout(self, recipe) -> Layout:
        """For shapes: the recipe's layout, Wan 2.1's when no configuration is at hand."""
        return self.layout(recipe) or Layout()

    @staticmethod
    def _grid(recipe, layout) -> tuple[int, int, int]:
        """Latent frames, height and width."""
        gen = recipe.generate
        return ((gen.frames - 1) // layout.temporal + 1, gen.height // layout.spatial,
                gen.width // layout.spatial)

    def initial_latents(self, pipe, recipe, generator):
        from diffusers.utils.torch_utils import randn_tensor

        # the noise is drawn first, exactly as both Wan pipelines draw it
        shape = (1, pipe.vae.config.z_dim, *self._grid(recipe, Layout.of_pipe(pipe)))
        return randn_tensor(shape, generator=generator, device=torch.device("cpu"),
                            dtype=torch.float32)

    def timesteps(self, pipe, recipe):
        pipe.scheduler.set_timesteps(recipe.generate.steps, device="jax")
        # A fixed start index avoids a value-dependent lookup in scheduler.step.
        pipe.scheduler.set_begin_index(0)
        return pipe.scheduler.timesteps

    def programs(self, recipe, modules):
        from porter_wan.programs import programs
        return programs(self, recipe, modules)

    def transformer_inputs(self, recipe, config):
        gen, batch, layout = recipe.generate, guidance.batch(self, recipe), self._layout(recipe)
        latent = (batch, config["in_channels"], *self._grid(recipe, layout))
        # TI2V: one timestep per token (the first frame's are 0 in image mode)
        timestep = (batch, self._tokens(recipe, config)) if layout.expand_timesteps else (batch,)
        return {"hidden_states": latent, "timestep": timestep,
                "encoder_hidden_states": (batch, gen.max_sequence_length, config["text_dim"])}

    def _tokens(self, recipe, config) -> int:
        frames, height, width = self._grid(recipe, self._layout(recipe))
        p_t, p_h, p_w = config["patch_size"]
        return (frames // p_t) * (height // p_h) * (width // p_w)

    def rotary_tables(self, pipe, recipe):
        from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

        entries = []
        for model in self.experts(pipe):
            rope = model.rope
            # A fresh module computes its tables in float64 on the host, as diffusers does.
            fresh = WanRotaryPosEmbed(rope.attention_head_dim, rope.patch_size,
                                      rope.max_seq_len)
            shape = self.transformer_inputs(recipe, model.config)["hidden_states"]
            tables = rotary.host_tables(fresh, shape)
            entries.append((rope, tuple(shape[2:]), tables, rope.freqs_cos.dtype))
        return entries

    @staticmethod
    def experts(pipe) -> list:
        """The pipeline's transformers: one (Wan 2.1) or two (Wan 2.2 A14B)."""
        return [m for m in (pipe.transformer, getattr(pipe, "transformer_2", None))
                if m is not None]

    def denoiser(self, pipe, timestep, sampling, recipe):
        """The transformer and guidance scale for this step, switched as diffusers does:
        the high-noise expert while t >= boundary_ratio * num_train_timesteps."""
        boundary = self._boundary(pipe)
        if boundary is None:
            return pipe.transformer, recipe.generate.guidance_scale
        if to_host(timestep).item() >= boundary:
            return pipe.transformer, recipe.generate.guidance_scale
        second = recipe.generate.guidance_scale_2
        return pipe.transformer_2, recipe.generate.guidance_scale if second is None else second

    def transformer_steps(self, pipe, recipe):
        """Two experts split the schedule at the boundary timestep."""
        boundary = self._boundary(pipe)
        if boundary is None:
            return {"transformer": recipe.generate.steps}
        scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)
        scheduler.set_timesteps(recipe.generate.steps, device="cpu")
        first = sum(1 for t in scheduler.timesteps if float(t) >= boundary)
        return {"transformer": first, "transformer_2": recipe.generate.steps - first}

    @staticmethod
    def _boundary(pipe) -> float | None:
        """The timestep from which the high-noise expert runs (two experts), or None."""
        ratio = pipe.config.get("boundary_ratio")
        if ratio is None or getattr(pipe, "transformer_2", None) is None:
            return None
        return ratio * pipe.scheduler.config.num_train_timesteps

    def size_problems(self, recipe, config):
        """Wan's rotary tables cover ``rope_max_seq_len`` positions on each axis of the
        patch grid; diffusers slices them to the grid, so a larger grid fails mid-step."""
        limit = config.get("rope_max_seq_len")
        if not limit:
            return []
        gen, layout = recipe.generate, self._layout(recipe)
        p_t, p_h, p_w = config["patch_size"]
        frames, height, width = self._grid(recipe, layout)
        space, time = layout.spatial, layout.temporal
        grid = {"frames": (frames // p_t, time * p_t, "frames"),
                "height": (height // p_h, space * p_h, "pixels"),
                "width": (width // p_w, space * p_w, "pixels")}
        problems = []
        for key, (positions, per_position, unit) in grid.items():
            if positions > limit:
                problems.append(recipe.problem(
                    f"generate.{key}", f"{getattr(gen, key)} {unit} make {positions} "
                    f"positions on this axis; the model's rotary tables hold {limit}",
                    hint=f"at most about {limit * per_position} {unit} "
                         f"(rope_max_seq_len {limit} x {per_position})"))
        return problems

    def estimates(self, recipe, config):
        gen = recipe.generate
        tokens = self._tokens(recipe, config)
        width = config["num_attention_heads"] * config["attention_head_dim"]
        text, ffn = gen.max_sequence_length, config["ffn_dim"]
        per_block = (2 * tokens * width * width * 4          # self-attention q, k, v, out
                     + 2 * 2 * tokens * tokens * width       # scores and weighted sum
                     + 2 * tokens * width * width * 2        # cross-attention q, out
                     + 2 * text * width * width * 2          # cross-attention k, v
                     + 2 * 2 * tokens * text * width         # cross scores and sum
                     + 2 * tokens * width * ffn * 2)         # FFN in and out
        passes = 2 if guidance.guided(self, recipe) else 1
        heads, batch = config["num_attention_heads"], guidance.batch(self, recipe)
        return {"tokens": tokens,
                "flops_per_step": passes * config["num_layers"] * per_block,
                # per transformer call (both passes in one batch only with cfg_parallel):
                # the widest activations of a block, its hidden states and FFN middle
                "activations": {"hidden": (batch, tokens, width),
                                "ffn": (batch, tokens, ffn)},
                "attention": {"self": (batch, heads, tokens, tokens),
                              "cross": (batch, heads, tokens, text)}}

    def model_input(self, pipe, latents, timestep, conditioning, model):
        if "condition" in conditioning:  # image-to-video: noise + mask + given frames
            latents = torch.cat([latents, conditioning["condition"]], dim=1)
        elif "frame_mask" in conditioning:  # TI2V: the given frame kept at every step
            latents = self.final_latents(pipe, latents, conditioning)
        return latents.to(model.dtype)

    def call(self, model, model_input, timestep, branch, conditioning):
        batch = model_input.shape[0]
        if "frame_mask" in conditioning:  # TI2V: one timestep per token of the patch grid
            mask = conditioning["frame_mask"]  # (patches are 2x2, as diffusers has it)
            timestep = (mask[0][0][:, ::2, ::2] * timestep).flatten().unsqueeze(0)
        # (batch,) or, with per-token timesteps, (batch, tokens)
        timestep = timestep.expand(batch, *timestep.shape[1:])
        extra = {}
        if "image_embeds" in conditioning:
            image = conditioning["image_embeds"]
            extra["encoder_hidden_states_image"] = torch.cat([image] * batch)
        return model(hidden_states=model_input, timestep=timestep,
                     encoder_hidden_states=branch["prompt"], return_dict=False, **extra)[0]

    def final_latents(self, pipe, latents, conditioning):
        """TI2V image mode: the given first frame in place of the denoised one (at every
        step's input too)."""
        if "image_latents" in conditioning:
            mask = conditioning["frame_mask"]
            return (1 - mask) * conditioning["image_latents"] + mask * latents
        return latents

    def decode(self, pipe, latents, recipe):
        from porter_wan.i2v import latent_stats

        vae = pipe.vae
        mean, inv_std = latent_stats(vae, vae.dtype)
        latents = latents.to(vae.dtype) / inv_std + mean
        video = to_host(vae.decode(latents.to("jax"), return_dict=False)[0])
        frames = pipe.video_processor.postprocess_video(video.float(), output_type="np")[0]
        return (frames * 255).round().clip(0, 255).astype("uint8")
