"""CogVideoX 1.0 (2b, 5b) and 1.5, text-to-video and image-to-video, split into the
steps Porter drives.

Each step mirrors ``diffusers.CogVideoXPipeline.__call__`` (and
``CogVideoXImageToVideoPipeline``'s) so that a Porter run and a plain diffusers
run from the same seed agree: one CPU generator draws the noise (after the
image's latent sample, for image-to-video) and, with CogVideoX's DPM-Solver, a
fresh draw at every step; CogVideoX 1.5 pads the latent frames to its temporal
patch and drops the padding before decoding. Rotary tables are built on the host
once (the ``cogvideox.rope_cache`` patch) and kept with the conditioning.
"""

from __future__ import annotations

import math

from porter.families import Grid, StagedFamily, batch, decoded_frames, guided
from porter.loading.model_configs import component_config
from porter.recipe.inputs import load_image
from porter.recipe.sources import source_kind
from porter.shims import lazy
from porter.shims.interop import to_host
from porter.transforms.dtypes import DTYPES
from porter_cogvideox import decoding, rules

torch = lazy.module("torch", __name__)

class CogVideoXFamily(StagedFamily):
    name = "cogvideox"
    title = "CogVideoX"
    summary = ("CogVideoX 1.0 (2b, 5b) and 1.5 text-to-video (CogVideoXPipeline); "
               "image-to-video (variant v1-i2v, CogVideoXImageToVideoPipeline)")
    #: tiny layouts (``source: tiny``); a checkpoint's own come from its configuration
    variants = ("v1", "v1.5", "v1-i2v")
    rotary_patch = "cogvideox.rope_cache"
    inputs = ("image",)
    extra = ("use_dynamic_cfg",)  # the pipeline's own argument
    text_tokens = 226  # the pipeline's default text length
    starter_generate = {**StagedFamily.starter_generate, "height": 16, "width": 16,
                        "frames": 9, "guidance_scale": 6.0, "max_sequence_length": 16,
                        "cfg_parallel": True}
    size_problems = rules.size_problems
    # the VAE decode too: eager, it runs op by op (and on every device of the mesh)
    compiled = {"text_encoder": ("forward",), "transformer": ("forward",),
                "vae": ("decode",)}
    compiled_functions = {"vae": {"decode_chunk": decoding.decode_chunk}}  # a stream
    scan_blocks = True  # each block's outputs are the next one's inputs
    # each block returns (video tokens, text tokens): (batch, tokens, width) first
    token_blocks = r"transformer_blocks\.\d+"

    def is_i2v(self, recipe) -> bool:
        """Image-to-video: the transformer takes the image's latents beside the noise
        (twice the channels it gives out), from the checkpoint's configuration; a tiny
        model's ``model.variant: v1-i2v``."""
        if recipe is None:
            return False
        config = component_config(self, recipe, "transformer")
        if config is None:
            return recipe.model.variant == "v1-i2v"
        return config.get("in_channels", 16) != config.get("out_channels", 16)

    def rotary_patch_for(self, recipe):
        return "cogvideox.rope_cache_i2v" if self.is_i2v(recipe) else self.rotary_patch

    def pipeline_class(self, recipe=None):
        from diffusers import CogVideoXImageToVideoPipeline, CogVideoXPipeline
        return CogVideoXImageToVideoPipeline if self.is_i2v(recipe) else CogVideoXPipeline

    def build_tiny(self, recipe):
        from porter_cogvideox.tiny import build_pipeline
        return build_pipeline("1.5" if recipe.model.variant == "v1.5" else "1.0",
                              image_to_video=self.is_i2v(recipe))

    def official_configs(self, source):
        from porter_cogvideox.configs import OFFICIAL
        return OFFICIAL.get(source)

    def grid(self, recipe):
        return Grid(temporal=4, spatial=8, patch=2)

    def version(self, recipe) -> str | None:
        """'1.5' when the transformer patches time (patch_size_t), else '1.0'; None where
        no configuration is at hand."""
        if source_kind(recipe.model.source) == "tiny":
            return "1.5" if recipe.model.variant == "v1.5" else "1.0"
        config = component_config(self, recipe, "transformer")
        if config is None:
            return None
        return "1.5" if config.get("patch_size_t") else "1.0"

    # latents are (batch, frames, channels, height, width) and decode pads frames by the
    # recipe's count: no live previews yet
    previews = False

    def check(self, recipe):
        return super().check(recipe) + rules.problems(self, recipe)


    # ------------------------------------------------------------------ the steps

    def _frames(self, pipe, recipe) -> tuple[int, int]:
        """(latent frames, latent frames after CogVideoX 1.5's padding to its temporal
        patch)."""
        frames = (recipe.generate.frames - 1) // pipe.vae_scale_factor_temporal + 1
        patch = pipe.transformer.config.patch_size_t
        return frames, frames + (-frames % patch if patch else 0)

    @staticmethod
    def _latent_dtype(pipe, recipe):
        """The latents' dtype: the prompt embeddings' (the pipeline's ``prompt_embeds
        .dtype``), the text encoder's unless ``dtypes.text_embeddings`` casts them."""
        cast = recipe.dtypes.text_embeddings
        return DTYPES[cast] if cast else pipe.text_encoder.dtype

    def encode(self, pipe, recipe):
        gen = recipe.generate
        device = torch.device("jax")
        prompt, negative = pipe.encode_prompt(
            gen.prompt, gen.negative_prompt, do_classifier_free_guidance=guided(self, recipe),
            num_videos_per_prompt=1, max_sequence_length=self.text_length(recipe),
            device=device)
        conditioning = {"prompt": prompt}
        if negative is not None:
            conditioning["negative"] = negative
        _, padded = self._frames(pipe, recipe)
        if pipe.transformer.config.use_rotary_positional_embeddings:
            cos, sin = pipe._prepare_rotary_positional_embeddings(gen.height, gen.width,
                                                                  padded, device)
            conditioning.update(rotary_cos=cos, rotary_sin=sin)
        if self.is_i2v(recipe):
            conditioning["image_latents"] = self._image_latents(pipe, recipe, padded, device)
        return conditioning

    def _image_latents(self, pipe, recipe, padded: int, device):
        """The given frame's latents, as the image-to-video pipeline makes them: sampled
        from the VAE's distribution with the run's generator (before the noise is
        drawn), then zero frames after it."""
        gen, dtype = recipe.generate, self._latent_dtype(pipe, recipe)
        image = load_image(recipe.file_path("generate.image", gen.image))
        pixels = pipe.video_processor.preprocess(image, height=gen.height, width=gen.width)
        generator = torch.Generator("cpu").manual_seed(gen.seed)
        frames = (padded - 1) * pipe.vae_scale_factor_temporal + 1
        _, image_latents = pipe.prepare_latents(
            pixels.to(device, dtype=dtype), 1, pipe.transformer.config.in_channels // 2,
            frames, gen.height, gen.width, dtype, device, generator)
        return image_latents

    def initial_latents(self, pipe, recipe, generator):
        from diffusers.utils.torch_utils import randn_tensor

        gen, config = recipe.generate, pipe.transformer.config
        spatial = pipe.vae_scale_factor_spatial
        height, width = gen.height // spatial, gen.width // spatial
        channels = config.in_channels
        if self.is_i2v(recipe):
            channels //= 2  # the other half are the image latents
            # the image's latent sample came first from the same stream: draw it again
            randn_tensor((1, pipe.vae.config.latent_channels, 1, height, width),
                         generator=generator, device=torch.device("cpu"),
                         dtype=pipe.vae.dtype)
        _, padded = self._frames(pipe, recipe)
        latents = randn_tensor((1, padded, channels, height, width), generator=generator,
                               device=torch.device("cpu"),
                               dtype=self._latent_dtype(pipe, recipe))
        return latents * pipe.scheduler.init_noise_sigma

    def timesteps(self, pipe, recipe):
        pipe.scheduler.set_timesteps(recipe.generate.steps, device="jax")
        return pipe.scheduler.timesteps

    def denoiser(self, pipe, timestep, sampling, recipe):
        """CogVideoX's dynamic guidance (``generate.extra.use_dynamic_cfg``) grows the
        scale along a cosine as the timestep falls."""
        scale, steps = recipe.generate.guidance_scale, recipe.generate.steps
        if recipe.generate.extra.get("use_dynamic_cfg"):
            t = to_host(timestep).item()
            scale = 1 + scale * ((1 - math.cos(math.pi * ((steps - t) / steps) ** 5.0)) / 2)
        return pipe.transformer, scale

    def model_input(self, pipe, latents, timestep, conditioning, model):
        latents = pipe.scheduler.scale_model_input(latents, timestep)
        if "image_latents" in conditioning:  # noise and the image's latents side by side
            latents = torch.cat([latents, conditioning["image_latents"]], dim=2)
        return latents

    def call(self, model, model_input, timestep, branch, conditioning):
        rotary = None
        if "rotary_cos" in conditioning:
            rotary = (conditioning["rotary_cos"], conditioning["rotary_sin"])
        extra = {}
        if "image_latents" in conditioning:  # CogVideoX1.5-I2V's frame-rate embedding
            extra["ofs"] = (None if model.config.ofs_embed_dim is None
                            else model_input.new_full((1,), fill_value=2.0))
        noise = model(hidden_states=model_input, encoder_hidden_states=branch["prompt"],
                      timestep=timestep.expand(model_input.shape[0]), **extra,
                      image_rotary_emb=rotary, attention_kwargs=None, return_dict=False)[0]
        return noise.float()

    def step(self, pipe, noise, timestep, latents, sampling):
        from diffusers import CogVideoXDPMScheduler

        dtype = latents.dtype
        extra = pipe.prepare_extra_step_kwargs(sampling.generator, 0.0)
        if not isinstance(pipe.scheduler, CogVideoXDPMScheduler):
            latents = pipe.scheduler.step(noise, timestep, latents, **extra,
                                          return_dict=False)[0]
        else:  # DPM-Solver: the previous step's clean-sample prediction rides along
            index = sampling.index
            back = sampling.timesteps[index - 1] if index > 0 else None
            latents, sampling.carry["old_pred_original_sample"] = pipe.scheduler.step(
                noise, sampling.carry.get("old_pred_original_sample"), timestep, back,
                latents, **extra, return_dict=False)
        return latents.to(dtype)

    def decode(self, pipe, latents, recipe):
        """CogVideoX 1.5's padding frames dropped (at the front, as diffusers does), then
        the VAE; the latents keep them, as the pipeline's last step has them."""
        frames, padded = self._frames(pipe, recipe)
        video = pipe.decode_latents(latents[:, padded - frames:].to("jax"))
        return decoded_frames(pipe, to_host(video))

    def decode_chunks(self, pipe, latents, recipe):
        """Two latent frames at a time (``decoding.chunks``), the padding dropped as
        ``decode`` drops it."""
        frames, padded = self._frames(pipe, recipe)
        return decoding.chunks(pipe, latents[:, padded - frames:])

    def programs(self, recipe, modules):
        from porter_cogvideox.programs import programs
        return programs(self, recipe, modules)

    def transformer_inputs(self, recipe, config):
        gen = recipe.generate
        count = batch(self, recipe)
        frames = (gen.frames - 1) // 4 + 1
        if config.get("patch_size_t"):
            frames += frames % config["patch_size_t"]  # the pipeline pads to the patch
        text = self.text_length(recipe)
        return {"hidden_states": (count, frames, config["in_channels"], gen.height // 8,
                                  gen.width // 8),
                "encoder_hidden_states": (count, text, config["text_embed_dim"]),
                "timestep": (count,)}
