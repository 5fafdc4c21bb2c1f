"""HunyuanVideo text-to-video.

The pipeline's own __call__ runs (as for the generic family); the plugin adds a
tiny model, official configurations, shape rules and the rotary cache. The
joint attention's text padding mask reaches attention as a boolean key mask,
which every Porter attention backend applies exactly.
"""

from __future__ import annotations

import torch

from porter.generic import GenericFamily
from porter.transforms import rotary


class HunyuanFamily(GenericFamily):
    name = "hunyuan"
    summary = ("HunyuanVideo (HunyuanVideoPipeline) and HunyuanVideo 1.5 "
               "(HunyuanVideo15Pipeline, variant v1.5) text-to-video")
    variants = ("v1", "v1.5")
    rotary_patch = "hunyuan.rope_cache"
    # the text encoders run op by op: Llama and Qwen return a key-value cache object
    # from forward, which a compiled program cannot return
    scan_blocks = True  # each block's outputs are the next one's inputs

    @staticmethod
    def is_15(recipe) -> bool:
        return recipe is not None and recipe.model.variant == "v1.5"

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

    def call_kwargs(self, recipe, cls):
        kwargs = super().call_kwargs(recipe, cls)
        if self.is_15(recipe):
            kwargs.pop("guidance_scale", None)  # 1.5 guides through its guider component
        return kwargs

    def generate(self, pipe, recipe):
        if self.is_15(recipe):
            pipe.guider.guidance_scale = recipe.generate.guidance_scale
        return super().generate(pipe, recipe)

    def programs(self, recipe, modules):
        from porter_hunyuan.programs import programs
        return programs(self, recipe, modules)

    def official_configs(self, source):
        from porter_hunyuan.configs import OFFICIAL
        return OFFICIAL.get(source)

    def starter_generate(self):
        return {**super().starter_generate(), "height": 16, "width": 16, "frames": 9,
                "guidance_scale": 6.0, "max_sequence_length": 16}

    def check(self, recipe):
        problems = [p for p in super().check(recipe) if p.path != "model.source"]
        frames = recipe.generate.frames
        if (frames - 1) % 4:
            below = frames - (frames - 1) % 4
            problems.append(recipe.problem(
                "generate.frames", f"HunyuanVideo needs 4n+1 frames, got {frames}",
                hint=f"try {below} or {below + 4} (129 is the default)"))
        for key in ("height", "width"):
            if getattr(recipe.generate, key) % 16:
                problems.append(recipe.problem(f"generate.{key}", "HunyuanVideo needs a "
                                               "multiple of 16 (VAE 8 x patch 2)"))
        return problems

    def transformer_inputs(self, recipe, config):
        gen = recipe.generate
        if self.is_15(recipe):  # the tiny 1.5 VAE compresses 2 x 4; the real one 4 x 16
            time, space = (2, 4) if recipe.model.source == "tiny" else (4, 16)
            batch = 2 if gen.guidance_scale > 1.0 else 1  # the guider batches the passes
        else:
            time, space, batch = 4, 8, 1  # guidance is an embedded scale: one pass
        return {"hidden_states": (batch, config["in_channels"], (gen.frames - 1) // time + 1,
                                  gen.height // space, gen.width // space),
                "timestep": (batch,)}

    def rotary_tables(self, pipe, recipe):
        rope = pipe.transformer.rope
        # a fresh module of the same class builds the tables on the host
        fresh = type(rope)(rope.patch_size, rope.patch_size_t, rope.rope_dim, rope.theta)
        shape = self.transformer_inputs(recipe, pipe.transformer.config)["hidden_states"]
        return [(rope, tuple(shape[2:]), rotary.host_tables(fresh, shape), torch.float32)]
