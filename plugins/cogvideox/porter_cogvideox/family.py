"""CogVideoX 1.0 (2b, 5b) and 1.5 text-to-video.

The pipeline's own __call__ runs (as for the generic family): it already
batches the two guidance passes, so the data axis splits them. What this
plugin adds: tiny models, official configurations, frame-count rules, and
rotary tables built on the host. Its schedulers (CogVideoXDDIM, CogVideoXDPM)
need nothing of their own: ``porter.schedulers`` serves every scheduler.
"""

from __future__ import annotations

import json
from pathlib import Path

from porter.generic import GenericFamily
from porter.loading import source_kind


class CogVideoXFamily(GenericFamily):
    name = "cogvideox"
    summary = ("CogVideoX 1.0 (2b, 5b) and 1.5 text-to-video (CogVideoXPipeline); "
               "image-to-video (variant v1-i2v, CogVideoXImageToVideoPipeline)")
    variants = ("v1", "v1.5", "v1-i2v")
    rotary_patch = "cogvideox.rope_cache"
    # the VAE decode too: eager, it runs op by op (and on every device of the mesh)
    compiled = {"text_encoder": ("forward",), "transformer": ("forward",),
                "vae": ("decode",)}
    scan_blocks = True  # each block's outputs are the next one's inputs

    @staticmethod
    def is_i2v(recipe) -> bool:
        return recipe is not None and recipe.model.variant == "v1-i2v"

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

    def starter_model(self):
        return {"source": "tiny", "dtype": "float32"}

    def starter_generate(self):
        return {**super().starter_generate(), "height": 16, "width": 16, "frames": 9,
                "guidance_scale": 6.0, "max_sequence_length": 16}

    def version(self, recipe) -> str | None:
        """'1.5' when the transformer patches time (patch_size_t), else '1.0'."""
        source, kind = recipe.model.source, source_kind(recipe.model.source)
        if kind == "tiny":
            return "1.5" if recipe.model.variant == "v1.5" else "1.0"
        if kind == "local":
            config = Path(source).expanduser() / "transformer" / "config.json"
            if not config.exists():
                return None
            return "1.5" if json.loads(config.read_text()).get("patch_size_t") else "1.0"
        configs = self.official_configs(source)
        if configs is None:
            return None
        return "1.5" if configs["transformer"][2].get("patch_size_t") else "1.0"

    def check(self, recipe):
        problems = [p for p in super().check(recipe) if p.path != "model.source"]
        image = recipe.generate.image
        if self.is_i2v(recipe) and not (image and recipe.file_path("generate.image",
                                                                    image).is_file()):
            problems.append(recipe.problem("generate.image", "image-to-video needs an "
                                           "existing image file",
                                           hint="generate.image: path/to/first_frame.png"))
        frames, version = recipe.generate.frames, self.version(recipe)
        if version == "1.5" and ((frames - 1) % 4 or ((frames - 1) // 4 + 1) % 2 == 0):
            below = max(9, frames - (frames - 1) % 8)
            problems.append(recipe.problem(
                "generate.frames", f"CogVideoX 1.5 needs 4n+1 frames with an odd number of "
                f"latent frames ((frames - 1) / 4 + 1), got {frames}",
                hint=f"valid counts are 8k+1: try {below} or {below + 8} (81 is the default)"))
        elif version == "1.0" and (frames - 1) % 4:
            below = frames - (frames - 1) % 4
            problems.append(recipe.problem(
                "generate.frames", f"CogVideoX needs 4n+1 frames, got {frames}",
                hint=f"try {below} or {below + 4} (49 is the default)"))
        vae = recipe.dtypes.components.get("vae", recipe.model.dtype)
        if vae != recipe.model.dtype:
            problems.append(recipe.problem(
                "dtypes.components.vae", f"the CogVideoX pipeline hands the VAE latents in "
                f"the transformer's dtype ({recipe.model.dtype}): a {vae} VAE fails to "
                "decode them", hint="leave the VAE in model.dtype, as diffusers runs it"))
        for key in ("height", "width"):
            if getattr(recipe.generate, key) % 16:
                problems.append(recipe.problem(f"generate.{key}", "CogVideoX needs a "
                                               "multiple of 16 (VAE 8 x patch 2)"))
        return problems

    def programs(self, recipe, modules):
        from porter_cogvideox.programs import programs
        return programs(self, recipe, modules)

    @staticmethod
    def text_length(recipe) -> int:
        """Text tokens per prompt: the recipe's, or the pipeline's own default (226)."""
        if recipe.sets("generate.max_sequence_length"):
            return recipe.generate.max_sequence_length
        return 226

    def size_problems(self, recipe, config):
        """Learned positional embeddings (CogVideoX-5b-I2V) exist for one size only, and
        absolute ones are laid out for exactly ``max_text_seq_length`` text tokens:
        diffusers fails mid-step otherwise."""
        gen, problems = recipe.generate, []
        if config.get("use_learned_positional_embeddings"):
            for key, sample in (("height", "sample_height"), ("width", "sample_width")):
                want = config.get(sample, 0) * 8
                if want and getattr(gen, key) != want:
                    problems.append(recipe.problem(
                        f"generate.{key}", f"this model's positional embeddings are "
                        f"learned for {want} {key} only, got {getattr(gen, key)}",
                        hint=f"set generate.{key}: {want}"))
        text = self.text_length(recipe)
        absolute = config.get("use_learned_positional_embeddings") or \
            not config.get("use_rotary_positional_embeddings")
        if absolute and text != config.get("max_text_seq_length", text):
            problems.append(recipe.problem(
                "generate.max_sequence_length", f"{text} text tokens; this model's "
                f"positional embeddings take exactly {config['max_text_seq_length']}",
                hint=f"set it to {config['max_text_seq_length']} or leave it out"))
        return problems

    def transformer_inputs(self, recipe, config):
        gen = recipe.generate
        batch = 2 if gen.guidance_scale > 1.0 else 1  # the pipeline batches the passes
        frames = (gen.frames - 1) // 4 + 1
        if config.get("patch_size_t"):
            frames += frames % config["patch_size_t"]  # the pipeline pads to the patch
        text = self.text_length(recipe)
        return {"hidden_states": (batch, frames, config["in_channels"], gen.height // 8,
                                  gen.width // 8),
                "encoder_hidden_states": (batch, text, config["text_embed_dim"]),
                "timestep": (batch,)}
