"""Wan 2.1 text-to-video, split into the steps Porter drives.

Each step mirrors ``diffusers.WanPipeline.__call__`` so that a Porter run and a
plain diffusers run from the same seed give the same latents.
"""

from __future__ import annotations

import torch

from porter.family import ModelFamily
from porter.interop import to_host
from porter.transforms import rotary


class WanFamily(ModelFamily):
    name = "wan"
    summary = ("Wan 2.1 and 2.2: text-to-video (WanPipeline), two-expert A14B, "
               "image-to-video (WanImageToVideoPipeline, variant i2v)")
    variants = ("t2v", "t2v-two-experts", "i2v")
    # Wan writes rotated q and k into strided slices: keep that out of a scatter
    rotary_patch = "wan.rope_cache"
    compiled = {"transformer": ("forward",), "transformer_2": ("forward",),
                "vae": ("decode",)}

    @staticmethod
    def is_i2v(recipe) -> bool:
        return recipe.model.variant == "i2v"

    def pipeline_class(self, recipe=None):
        from diffusers import WanImageToVideoPipeline, WanPipeline
        return WanImageToVideoPipeline if recipe and self.is_i2v(recipe) else WanPipeline

    def starter_generate(self):
        return {**super().starter_generate(), "max_sequence_length": 32}

    def official_configs(self, source):
        from porter_wan.configs import OFFICIAL
        return OFFICIAL.get(source)

    def build_tiny(self, recipe):
        from porter_wan.tiny import build_i2v_pipeline, build_pipeline
        if self.is_i2v(recipe):
            return build_i2v_pipeline()
        experts = 2 if recipe.model.variant == "t2v-two-experts" else 1
        return build_pipeline(experts=experts, transformer_config=dict(recipe.model.config))

    def check(self, recipe):
        gen, problems = recipe.generate, super().check(recipe)
        if recipe.model.config:
            import inspect

            from diffusers import WanTransformer3DModel
            known = set(inspect.signature(WanTransformer3DModel.__init__).parameters) - {"self"}
            for key in sorted(set(recipe.model.config) - known):
                problems.append(recipe.problem(f"model.config.{key}", f"WanTransformer3DModel "
                                               f"has no argument {key!r}",
                                               hint="arguments: " + ", ".join(sorted(known))))
        for key in ("height", "width"):
            value = getattr(gen, key)
            if value % 16:
                fit = f"{value - value % 16} or {value + 16 - value % 16}"
                problems.append(recipe.problem(
                    f"generate.{key}", f"Wan needs a multiple of 16, got {value}",
                    hint=f"try {fit} (VAE downsamples by 8, patches are 2 wide)"))
        if self.is_i2v(recipe) and not gen.image:
            problems.append(recipe.problem("generate.image", "image-to-video needs an image",
                                           hint="generate.image: path/to/first_frame.png"))
        if gen.image and not self.is_i2v(recipe):
            problems.append(recipe.problem("generate.image", "only image-to-video takes an "
                                           "image", hint="set model.variant: i2v"))
        if gen.image and not recipe.file_path("generate.image", gen.image).is_file():
            problems.append(recipe.problem("generate.image", f"{gen.image!r} is not a file"))
        if (gen.frames - 1) % 4:
            below = gen.frames - (gen.frames - 1) % 4
            problems.append(recipe.problem(
                "generate.frames", f"Wan needs 4n+1 frames, got {gen.frames}",
                hint=f"try {below} or {below + 4} (the VAE compresses time by 4)"))
        return problems

    @staticmethod
    def guided(recipe) -> bool:
        return recipe.generate.guidance_scale > 1.0

    def encode(self, pipe, recipe):
        gen = recipe.generate
        prompt, negative = pipe.encode_prompt(
            gen.prompt, gen.negative_prompt, do_classifier_free_guidance=self.guided(recipe),
            max_sequence_length=gen.max_sequence_length, device="jax")
        dtype = pipe.transformer.dtype
        conditioning = {"prompt": prompt.to(dtype)}
        if negative is not None:
            conditioning["negative"] = negative.to(dtype)
        if self.is_i2v(recipe):
            from porter_wan import i2v
            image = i2v.load_image(recipe.file_path("generate.image", gen.image))
            conditioning["image_embeds"] = i2v.image_embeds(pipe, image).to(dtype)
            conditioning["condition"] = i2v.first_frame_condition(pipe, image, recipe).to("jax")
        return conditioning

    def initial_latents(self, pipe, recipe):
        from diffusers.utils.torch_utils import randn_tensor

        gen = recipe.generate
        generator = torch.Generator("cpu").manual_seed(gen.seed)
        # the noise is drawn first, exactly as both Wan pipelines draw it
        shape = (1, pipe.vae.config.z_dim, (gen.frames - 1) // pipe.vae_scale_factor_temporal + 1,
                 gen.height // pipe.vae_scale_factor_spatial,
                 gen.width // pipe.vae_scale_factor_spatial)
        return randn_tensor(shape, generator=generator, device=torch.device("cpu"),
                            dtype=torch.float32)

    def timesteps(self, pipe, recipe):
        pipe.scheduler.set_timesteps(recipe.generate.steps, device="jax")
        # A fixed start index avoids a value-dependent lookup in scheduler.step.
        pipe.scheduler.set_begin_index(0)
        return pipe.scheduler.timesteps

    def batch(self, recipe) -> int:
        return 2 if recipe.generate.cfg_parallel and self.guided(recipe) else 1

    def transformer_inputs(self, recipe, config):
        gen, batch = recipe.generate, self.batch(recipe)
        # VAE: time compressed by 4 (4n+1 frames), space by 8
        latent = (batch, config["in_channels"], (gen.frames - 1) // 4 + 1,
                  gen.height // 8, gen.width // 8)
        return {"hidden_states": latent, "timestep": (batch,),
                "encoder_hidden_states": (batch, gen.max_sequence_length, config["text_dim"])}

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

    def expert(self, pipe, timestep, recipe):
        """The transformer and guidance scale for this step, switched as diffusers does:
        the high-noise expert while t >= boundary_ratio * num_train_timesteps."""
        ratio = pipe.config.get("boundary_ratio")
        if ratio is None or getattr(pipe, "transformer_2", None) is None:
            return pipe.transformer, recipe.generate.guidance_scale
        boundary = ratio * pipe.scheduler.config.num_train_timesteps
        if to_host(timestep).item() >= boundary:
            return pipe.transformer, recipe.generate.guidance_scale
        second = recipe.generate.guidance_scale_2
        return pipe.transformer_2, recipe.generate.guidance_scale if second is None else second

    def size_problems(self, recipe, config):
        """Wan's rotary tables cover ``rope_max_seq_len`` positions on each axis of the
        patch grid; diffusers slices them to the grid, so a larger grid fails mid-step."""
        limit = config.get("rope_max_seq_len")
        if not limit:
            return []
        gen = recipe.generate
        p_t, p_h, p_w = config["patch_size"]
        grid = {"frames": (((gen.frames - 1) // 4 + 1) // p_t, 4 * p_t, "frames"),
                "height": (gen.height // 8 // p_h, 8 * p_h, "pixels"),
                "width": (gen.width // 8 // p_w, 8 * p_w, "pixels")}
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
        p_t, p_h, p_w = config["patch_size"]
        tokens = (((gen.frames - 1) // 4 + 1) // p_t) * (gen.height // 8 // p_h) \
            * (gen.width // 8 // p_w)
        width = config["num_attention_heads"] * config["attention_head_dim"]
        text, ffn = gen.max_sequence_length, config["ffn_dim"]
        per_block = (2 * tokens * width * width * 4          # self-attention q, k, v, out
                     + 2 * 2 * tokens * tokens * width       # scores and weighted sum
                     + 2 * tokens * width * width * 2        # cross-attention q, out
                     + 2 * text * width * width * 2          # cross-attention k, v
                     + 2 * 2 * tokens * text * width         # cross scores and sum
                     + 2 * tokens * width * ffn * 2)         # FFN in and out
        passes = 2 if self.guided(recipe) else 1
        heads, batch = config["num_attention_heads"], self.batch(recipe)
        return {"tokens": tokens,
                "flops_per_step": passes * config["num_layers"] * per_block,
                # per transformer call (both passes in one batch only with cfg_parallel):
                # the widest activations of a block, its hidden states and FFN middle
                "activations": {"hidden": (batch, tokens, width),
                                "ffn": (batch, tokens, ffn)},
                "attention": {"self": (batch, heads, tokens, tokens),
                              "cross": (batch, heads, tokens, text)}}

    def predict(self, pipe, latents, timestep, conditioning, recipe):
        model, scale = self.expert(pipe, timestep, recipe)
        model_input = latents
        if "condition" in conditioning:  # image-to-video: noise + mask + first frame
            model_input = torch.cat([latents, conditioning["condition"]], dim=1)
        model_input = model_input.to(model.dtype)
        image = conditioning.get("image_embeds")
        guided = "negative" in conditioning
        if guided and self.batch(recipe) == 2:
            # one call, batch [cond, uncond]: the data axis can split it
            both = torch.cat([model_input, model_input])
            text = torch.cat([conditioning["prompt"], conditioning["negative"]])
            images = None if image is None else torch.cat([image, image])
            noise, uncond = self._call(model, both, timestep, text, images).chunk(2)
        else:
            noise = self._call(model, model_input, timestep, conditioning["prompt"], image)
            if not guided:
                return noise
            uncond = self._call(model, model_input, timestep, conditioning["negative"], image)
        return uncond + scale * (noise - uncond)

    @staticmethod
    def _call(model, latents, timestep, text, image=None):
        extra = {} if image is None else {"encoder_hidden_states_image": image}
        return model(hidden_states=latents, timestep=timestep.expand(latents.shape[0]),
                     encoder_hidden_states=text, return_dict=False, **extra)[0]

    def decode(self, pipe, latents, recipe):
        vae = pipe.vae
        z_dim = vae.config.z_dim
        latents = latents.to(vae.dtype)
        mean = torch.tensor(vae.config.latents_mean).view(1, z_dim, 1, 1, 1).to(vae.dtype)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, z_dim, 1, 1, 1).to(vae.dtype)
        latents = latents / inv_std + mean
        video = to_host(vae.decode(latents.to("jax"), return_dict=False)[0])
        frames = pipe.video_processor.postprocess_video(video.float(), output_type="np")[0]
        return (frames * 255).round().clip(0, 255).astype("uint8")
