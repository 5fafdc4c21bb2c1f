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
    summary = "HunyuanVideo text-to-video (HunyuanVideoPipeline)"
    rotary_patch = "hunyuan.rope_cache"

    def pipeline_class(self, recipe=None):
        from diffusers import HunyuanVideoPipeline
        return HunyuanVideoPipeline

    def build_tiny(self, recipe):
        from porter_hunyuan.tiny import build_pipeline
        return build_pipeline()

    def official_configs(self, source):
        from porter_hunyuan.configs import OFFICIAL
        return OFFICIAL.get(source)

    def starter_generate(self):
        return {**super().starter_generate(), "height": 16, "width": 16, "frames": 9,
                "guidance_scale": 6.0, "extra": {"max_sequence_length": 16}}

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
        batch = 1  # the pipeline runs guidance as an embedded scale, not two passes
        return {"hidden_states": (batch, config["in_channels"], (gen.frames - 1) // 4 + 1,
                                  gen.height // 8, gen.width // 8),
                "timestep": (batch,)}

    def rotary_tables(self, pipe, recipe):
        from diffusers.models.transformers.transformer_hunyuan_video import (
            HunyuanVideoRotaryPosEmbed)

        rope = pipe.transformer.rope
        fresh = HunyuanVideoRotaryPosEmbed(rope.patch_size, rope.patch_size_t, rope.rope_dim,
                                           rope.theta)
        shape = self.transformer_inputs(recipe, pipe.transformer.config)["hidden_states"]
        return [(rope, tuple(shape[2:]), rotary.host_tables(fresh, shape), torch.float32)]
