"""Wan 2.1 and 2.2, split into the steps Porter drives.

Each step mirrors ``diffusers.WanPipeline.__call__`` (text-to-video) or
``WanImageToVideoPipeline.__call__`` (a first frame, optionally a last frame)
so that a Porter run and a plain diffusers run from the same seed give the same
latents. What differs between Wan models (experts, conditioning channels,
per-token timesteps, VAE) is read from their configuration (``Layout``); their
checks are ``rules``', their shapes and costs ``shapes``'.
"""

from __future__ import annotations

from pathlib import Path

from porter.families import StagedFamily, decoded_frames, from_the_start, guided, width
from porter.loading.model_configs import cached_snapshot
from porter.recipe.sources import source_kind
from porter.shims import lazy
from porter.shims.interop import to_host
from porter_wan import decoding, i2v, rules, shapes, tiny, umt5
from porter_wan.configs import OFFICIAL, PIPELINE
from porter_wan.layout import Layout

torch = lazy.module("torch", __name__)


class WanFamily(StagedFamily):
    name = "wan"
    title = "Wan"
    windows = True  # self-attention over the video's tokens alone, text by cross-attention
    summary = ("Wan 2.1 and 2.2: text-to-video, two-expert A14B (text and image), "
               "image-to-video, first-last-frame, TI2V-5B (text and image)")
    variants = tuple(tiny.VARIANTS)
    # Wan writes rotated q and k into strided slices: keep that out of a scatter
    rotary_patch = "wan.rope_cache"
    required_patches = ("core.wan_rotary_halves",)  # queries and keys in halves order
    embedding_keys = ("prompt", "negative", "image_embeds")
    scan_blocks = True  # each block's output is the next one's input
    stepped_transformers = ("transformer", "transformer_2")  # two experts
    token_blocks = r"blocks\.\d+"  # each block's output: (batch, tokens, width)
    # the original release's own key names: its transformer and VAE through diffusers'
    # converters, its UMT5 encoder (a .pth) through Porter's
    single_file_converters = {"transformer": "convert_wan_transformer_to_diffusers",
                              "vae": "convert_wan_vae_to_diffusers",
                              "text_encoder": umt5.from_wan_names}
    compiled = {"text_encoder": ("forward",), "image_encoder": ("forward",),
                "transformer": ("forward",), "transformer_2": ("forward",),
                "vae": ("decode", "_encode")}
    compiled_functions = {"vae": {"decode_chunk": decoding.decode_chunk}}  # a stream
    starter_generate = {**StagedFamily.starter_generate, "max_sequence_length": 32}
    # the VAE's latent frames after the first as one loop: every Wan recipe's
    starter_patches = ("core.report_compiling", "wan.vae_decode_scan", "wan.vae_encode_scan")

    # its checks, shapes and costs, by its layout (rules.py, shapes.py)
    transformer_inputs = shapes.transformer_inputs
    rotary_tables = shapes.rotary_tables
    transformer_steps = shapes.transformer_steps
    size_problems = shapes.size_problems
    estimates = shapes.estimates

    def check(self, recipe):
        return super().check(recipe) + rules.problems(self, recipe)

    def default_activations(self, recipe, name, axes, config=None):
        """Each transformer's residual split along its width over attention's head axis
        (``porter.families.width``): each chip normalizes, modulates and adds its share
        of the width instead of all of it (the matmuls' inputs gathered, their sums
        arriving split). Two Wan 14B blocks at 720p on v6e-8 (dp=2 x tp=4): 218 M
        of the TPU compiler's cycles to 179 M, peak 5.25 to 3.18 GiB a chip, 7.0 to 10.1 GB
        a chip between chips (benchmarks/README.md). Only where the heads of its
        configuration divide the axis."""
        return width.residual_split(recipe, axes, width.heads_of(config))

    # ------------------------------------------------------------------ its models

    def layout(self, recipe) -> Layout | None:
        """The recipe's model layout, from its configuration files (no weights read);
        None for a hub id Porter has no configuration for and the cache does not hold
        (the rules that need a layout wait for the run, which downloads it)."""
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

    def layout_or_default(self, recipe) -> Layout:
        """For shapes: the recipe's layout, Wan 2.1's when no configuration is at hand."""
        return self.layout(recipe) or Layout()

    def grid(self, recipe):
        layout = self.layout(recipe)
        return None if layout is None else layout.grid

    def pipeline_class(self, recipe=None):
        from diffusers import WanImageToVideoPipeline, WanPipeline
        given = recipe is not None and recipe.generate.image is not None
        return WanImageToVideoPipeline if given else WanPipeline

    def official_configs(self, source):
        return OFFICIAL.get(source)

    def release(self, folder):
        from porter_wan import release  # lazy: only for a folder that is not diffusers'
        return release.describe(folder)

    def build_tiny(self, recipe):
        return tiny.build(recipe.model.variant, image=recipe.generate.image is not None,
                          transformer_config_overrides=dict(recipe.model.config))

    def programs(self, recipe, modules):
        from porter_wan.programs import programs  # lazy: porter compile's only
        return programs(self, recipe, modules)

    @staticmethod
    def experts(pipe) -> list:
        """The pipeline's transformers: one (Wan 2.1) or two (Wan 2.2 A14B)."""
        return [m for m in (pipe.transformer, getattr(pipe, "transformer_2", None))
                if m is not None]

    @staticmethod
    def boundary(pipe) -> float | None:
        """The timestep from which the high-noise expert runs (two experts), or None."""
        ratio = pipe.config.get("boundary_ratio")
        if ratio is None or getattr(pipe, "transformer_2", None) is None:
            return None
        return ratio * pipe.scheduler.config.num_train_timesteps

    # ------------------------------------------------------------------ the steps

    def encode(self, pipe, recipe):
        gen = recipe.generate
        prompt, negative = pipe.encode_prompt(
            gen.prompt, gen.negative_prompt, do_classifier_free_guidance=guided(self, recipe),
            max_sequence_length=gen.max_sequence_length, device="jax")
        dtype = self.experts(pipe)[0].dtype
        conditioning = {"prompt": prompt.to(dtype)}
        if negative is not None:
            conditioning["negative"] = negative.to(dtype)
        layout = Layout.of_pipe(pipe)
        if gen.image is not None:
            conditioning.update(i2v.conditioning(pipe, recipe, layout,
                                                 layout.grid.latents(recipe)))
            if "image_embeds" in conditioning:
                conditioning["image_embeds"] = conditioning["image_embeds"].to(dtype)
        elif layout.expand_timesteps:  # text mode: every latent frame is denoised
            conditioning["frame_mask"] = i2v.frame_mask(layout.grid.latents(recipe),
                                                        first_given=False).to("jax")
        return conditioning

    def initial_latents(self, pipe, recipe, generator):
        from diffusers.utils.torch_utils import randn_tensor

        # the noise is drawn first, exactly as both Wan pipelines draw it
        shape = (1, pipe.vae.config.z_dim, *Layout.of_pipe(pipe).grid.latents(recipe))
        return randn_tensor(shape, generator=generator, device=torch.device("cpu"),
                            dtype=torch.float32)

    def timesteps(self, pipe, recipe):
        pipe.scheduler.set_timesteps(recipe.generate.steps, device="jax")
        from_the_start(pipe.scheduler)
        return pipe.scheduler.timesteps

    def denoiser(self, pipe, timestep, sampling, recipe):
        """The transformer and guidance scale for this step, switched as diffusers does:
        the high-noise expert while t >= boundary_ratio * num_train_timesteps."""
        boundary = self.boundary(pipe)
        if boundary is None:
            return pipe.transformer, recipe.generate.guidance_scale
        if to_host(timestep).item() >= boundary:
            return pipe.transformer, recipe.generate.guidance_scale
        second = recipe.generate.guidance_scale_2
        return pipe.transformer_2, recipe.generate.guidance_scale if second is None else second

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
        latents = decoding.denormalized(pipe.vae, latents)
        return decoded_frames(pipe, to_host(pipe.vae.decode(latents.to("jax"),
                                                            return_dict=False)[0]))

    def decode_chunks(self, pipe, latents, recipe):
        """Latent frame by latent frame (``decoding.chunks``): the first frame, then
        four at a time."""
        return decoding.chunks(pipe, latents)
