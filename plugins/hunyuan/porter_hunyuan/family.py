"""HunyuanVideo and HunyuanVideo 1.5 text-to-video, split into the steps Porter drives.

Each step mirrors ``diffusers.HunyuanVideoPipeline.__call__`` (and
``HunyuanVideo15Pipeline``'s) so that a Porter run and a plain diffusers run from
the same seed agree. HunyuanVideo is guidance-distilled: ``guidance_scale`` reaches
the transformer as an input, and two branches run only for true guidance
(``generate.extra.true_cfg_scale`` above 1). HunyuanVideo 1.5 guides as its guider
component does (classifier-free guidance at ``guidance_scale``). The joint
attention's text padding mask reaches attention as a boolean key mask, which every
Porter attention backend applies exactly.
"""

from __future__ import annotations

import numpy as np

from porter.errors import UsageError
from porter.families import (
    Grid,
    StagedFamily,
    batch,
    decoded_frames,
    from_the_start,
    guided,
)
from porter.loading.model_configs import component_config, setting
from porter.shims import lazy
from porter.shims.interop import to_host
from porter.transforms import rotary
from porter_hunyuan.tiny import VAE as TINY_VAE
from porter_hunyuan.tiny import VAE_15 as TINY_VAE_15

torch = lazy.module("torch", __name__)

#: ``generate.extra`` keys each model reads (HunyuanVideoPipeline's own arguments)
EXTRA = {"v1": ("true_cfg_scale",), "v1.5": ()}


class HunyuanFamily(StagedFamily):
    name = "hunyuan"
    title = "HunyuanVideo"
    summary = ("HunyuanVideo (HunyuanVideoPipeline) and HunyuanVideo 1.5 "
               "(HunyuanVideo15Pipeline, variant v1.5) text-to-video")
    #: tiny layouts (``source: tiny``); a checkpoint's own come from its configuration
    variants = ("v1", "v1.5")
    rotary_patch = "hunyuan.rope_cache"
    # both text encoders too (Llama and CLIP; 1.5: Qwen 2.5-VL's language model and
    # ByT5), compiled keeping no key/value cache (``jit.no_cache``)
    compiled = {"text_encoder": ("forward",), "text_encoder_2": ("forward",),
                **StagedFamily.compiled}
    scan_blocks = True  # each block's outputs are the next one's inputs
    inputs = ()  # text-to-video
    text_tokens = 256  # HunyuanVideoPipeline's own (tokens kept after its prompt template)
    starter_generate = {**StagedFamily.starter_generate, "height": 16, "width": 16,
                        "frames": 9, "guidance_scale": 6.0, "max_sequence_length": 16}

    def is_15(self, recipe) -> bool:
        """HunyuanVideo 1.5, from the checkpoint's transformer class; a tiny model's
        ``model.variant: v1.5``."""
        if recipe is None:
            return False
        config = component_config(self, recipe, "transformer")
        if config is None:
            return recipe.model.variant == "v1.5"
        return config.get("_class_name") == "HunyuanVideo15Transformer3DModel"

    def _compression(self, recipe) -> tuple[int, int]:
        """(time, space): how much the VAE compresses, from its configuration."""
        cls = "AutoencoderKLHunyuanVideo15" if self.is_15(recipe) else "AutoencoderKLHunyuanVideo"
        config = component_config(self, recipe, "vae")
        if config is None:  # a tiny model
            config = TINY_VAE_15 if self.is_15(recipe) else TINY_VAE
        return (setting(config, cls, "temporal_compression_ratio"),
                setting(config, cls, "spatial_compression_ratio"))

    def rotary_patch_for(self, recipe):
        return "hunyuan.rope_cache_15" if self.is_15(recipe) else self.rotary_patch

    def pipeline_class(self, recipe=None):
        from diffusers import HunyuanVideo15Pipeline, HunyuanVideoPipeline
        return HunyuanVideo15Pipeline if self.is_15(recipe) else HunyuanVideoPipeline

    def build_tiny(self, recipe):
        from porter_hunyuan.tiny import build_pipeline, build_pipeline_15
        if self.is_15(recipe):
            return build_pipeline_15(guidance_scale=recipe.generate.guidance_scale)
        return build_pipeline()

    #: conditional -> unconditional entries: the text embeddings, their masks and
    #: (HunyuanVideo) the pooled CLIP embedding or (1.5) the glyph encoder's
    guidance_pairs = {"prompt": "negative", "prompt_mask": "negative_mask",
                      "prompt_pooled": "negative_pooled", "prompt_2": "negative_2",
                      "prompt_mask_2": "negative_mask_2"}
    embedding_keys = ("prompt", "negative", "prompt_pooled", "negative_pooled", "prompt_2",
                      "negative_2")

    def cfg_scale(self, recipe):
        if self.is_15(recipe):
            return recipe.generate.guidance_scale
        return float(recipe.generate.extra.get("true_cfg_scale", 1.0))

    def programs(self, recipe, modules):
        from porter_hunyuan.programs import programs
        return programs(self, recipe, modules)

    def official_configs(self, source):
        from porter_hunyuan.configs import OFFICIAL
        return OFFICIAL.get(source)

    def extra_keys(self, recipe):
        return EXTRA["v1.5" if self.is_15(recipe) else "v1"]

    def check(self, recipe):
        problems = super().check(recipe)
        if recipe.generate.guidance_scale_2 is not None:
            problems.append(recipe.problem("generate.guidance_scale_2", "HunyuanVideo takes "
                                           "no second guidance scale",
                                           hint="leave generate.guidance_scale_2 out"))
        return problems

    def grid(self, recipe):
        time, space = self._compression(recipe)
        # the published transformers' patches: 2 latents across (1.5: 1)
        return Grid(time, space, 1 if self.is_15(recipe) else 2)

    def transformer_inputs(self, recipe, config):
        count = batch(self, recipe)
        return {"hidden_states": (count, config["in_channels"], *self.latent_grid(recipe)),
                "timestep": (count,)}

    def rotary_tables(self, pipe, recipe):
        rope = pipe.transformer.rope
        # a fresh module of the same class builds the tables on the host
        fresh = type(rope)(rope.patch_size, rope.patch_size_t, rope.rope_dim, rope.theta)
        shape = self.transformer_inputs(recipe, pipe.transformer.config)["hidden_states"]
        return [(rope, tuple(shape[2:]), rotary.host_tables(fresh, shape), torch.float32)]

    # ------------------------------------------------------------------ the steps

    def encode(self, pipe, recipe):
        gen, device = recipe.generate, torch.device("jax")
        dtype = pipe.transformer.dtype
        texts = [("prompt", gen.prompt)]
        if guided(self, recipe):
            texts.append(("negative", gen.negative_prompt))
        if self.is_15(recipe):
            self._check_guider(pipe, recipe)
            # no image: zero image embeddings, as the text-to-video pipeline passes them
            found = {"image_embeds": torch.zeros(1, pipe.vision_num_semantic_tokens,
                                                 pipe.vision_states_dim, dtype=dtype,
                                                 device=device)}
        else:  # guidance-distilled: the scale is an input (x 1000, as the pipeline has it)
            found = {"guidance": torch.tensor([gen.guidance_scale], dtype=dtype,
                                              device=device) * 1000.0}
        for name, text in texts:
            if self.is_15(recipe):
                embeds, mask, embeds_2, mask_2 = pipe.encode_prompt(
                    prompt=text, device=device, dtype=dtype, batch_size=1,
                    num_videos_per_prompt=1)
                found.update({name: embeds, f"{name}_mask": mask, f"{name}_2": embeds_2,
                              f"{name}_mask_2": mask_2})
            else:
                embeds, pooled, mask = pipe.encode_prompt(
                    prompt=text, num_videos_per_prompt=1, device=device,
                    max_sequence_length=self.text_length(recipe))
                found.update({name: embeds.to(dtype), f"{name}_mask": mask.to(dtype),
                              f"{name}_pooled": pooled.to(dtype)})
        return found

    @staticmethod
    def _check_guider(pipe, recipe) -> None:
        """1.5 guides through its guider component: Porter's guidance is its plain
        classifier-free guidance (the checkpoint's guider, with the recipe's scale)."""
        from diffusers import ClassifierFreeGuidance

        guider = pipe.guider
        plain = (type(guider) is ClassifierFreeGuidance and not guider.guidance_rescale
                 and not guider.use_original_formulation and guider._start == 0.0
                 and guider._stop == 1.0 and guider._enabled)
        if not plain:
            raise UsageError(f"{recipe.model.source}: its guider ({type(guider).__name__}, "
                             f"{dict(guider.config)}) is not plain classifier-free guidance, "
                             "which Porter's staged loop runs",
                             hint="guidance_rescale 0, start 0, stop 1, enabled")

    def initial_latents(self, pipe, recipe, generator):
        gen = recipe.generate
        channels = (pipe.num_channels_latents if self.is_15(recipe)
                    else pipe.transformer.config.in_channels)
        dtype = pipe.transformer.dtype if self.is_15(recipe) else torch.float32
        return pipe.prepare_latents(1, channels, gen.height, gen.width, gen.frames, dtype,
                                    torch.device("cpu"), generator)

    def timesteps(self, pipe, recipe):
        from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import (
            retrieve_timesteps,
        )

        steps = recipe.generate.steps
        sigmas = np.linspace(1.0, 0.0, steps + 1)[:-1]
        timesteps, _ = retrieve_timesteps(pipe.scheduler, steps, "jax", sigmas=sigmas)
        from_the_start(pipe.scheduler)
        return timesteps

    def denoiser(self, pipe, timestep, sampling, recipe):
        return pipe.transformer, self.cfg_scale(recipe)

    def model_input(self, pipe, latents, timestep, conditioning, model):
        if not hasattr(pipe, "guider"):  # HunyuanVideo: the latents alone
            return latents.to(model.dtype)
        # 1.5 text-to-video: no conditioning frames (zeros) and a zero mask beside them
        batch, channels, frames, height, width = latents.shape
        return torch.cat([latents, latents.new_zeros(batch, channels, frames, height, width),
                          latents.new_zeros(batch, 1, frames, height, width)], dim=1)

    def call(self, model, model_input, timestep, branch, conditioning):
        batch = model_input.shape[0]
        if "prompt_2" in branch:  # 1.5
            image = conditioning["image_embeds"].expand(batch, -1, -1)
            return model(hidden_states=model_input, image_embeds=image,
                         timestep=timestep.expand(batch).to(model_input.dtype),
                         attention_kwargs=None, return_dict=False,
                         encoder_hidden_states=branch["prompt"],
                         encoder_attention_mask=branch["prompt_mask"],
                         encoder_hidden_states_2=branch["prompt_2"],
                         encoder_attention_mask_2=branch["prompt_mask_2"])[0]
        return model(hidden_states=model_input, timestep=timestep.expand(batch).float(),
                     encoder_hidden_states=branch["prompt"],
                     encoder_attention_mask=branch["prompt_mask"],
                     pooled_projections=branch["prompt_pooled"],
                     guidance=conditioning["guidance"].expand(batch), attention_kwargs=None,
                     return_dict=False)[0]

    def decode(self, pipe, latents, recipe):
        vae = pipe.vae
        latents = latents.to("jax").to(vae.dtype) / vae.config.scaling_factor
        return decoded_frames(pipe, to_host(vae.decode(latents, return_dict=False)[0]))
