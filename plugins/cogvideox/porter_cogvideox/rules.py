"""What CogVideoX's models need of a recipe beyond the shared checks (sizes, inputs,
extra keys): an image for image-to-video and none otherwise, an odd number of latent
frames for 1.5, the VAE in the transformer's dtype, and the one size learned positional
embeddings take."""

from __future__ import annotations

from porter.errors import Problem


def problems(family, recipe) -> list[Problem]:
    gen, found = recipe.generate, []
    image = gen.image
    if family.is_i2v(recipe) and not (image and recipe.file_path("generate.image",
                                                                  image).is_file()):
        found.append(recipe.problem("generate.image", "image-to-video needs an existing "
                                    "image file",
                                    hint="generate.image: path/to/first_frame.png"))
    if image is not None and not family.is_i2v(recipe):
        found.append(recipe.problem("generate.image", "CogVideoX text-to-video takes no "
                                    "image", hint="for image-to-video: model.variant: v1-i2v"))
    if gen.guidance_scale_2 is not None:
        found.append(recipe.problem("generate.guidance_scale_2", "CogVideoX takes no "
                                    "guidance scale 2", hint="leave generate.guidance_scale_2 "
                                    "out"))
    frames = gen.frames
    if family.version(recipe) == "1.5" and not (frames - 1) % 4 \
            and ((frames - 1) // 4 + 1) % 2 == 0:
        below = max(9, frames - (frames - 1) % 8)
        found.append(recipe.problem(
            "generate.frames", f"CogVideoX 1.5 needs 4n+1 frames with an odd number of "
            f"latent frames ((frames - 1) / 4 + 1), got {frames}",
            hint=f"valid counts are 8k+1: try {below} or {below + 8} (81 is the default)"))
    vae = recipe.dtypes.components.get("vae", recipe.model.dtype)
    if vae != recipe.model.dtype:
        found.append(recipe.problem(
            "dtypes.components.vae", f"the CogVideoX pipeline hands the VAE latents in the "
            f"transformer's dtype ({recipe.model.dtype}): a {vae} VAE fails to decode them",
            hint="leave the VAE in model.dtype, as diffusers runs it"))
    return found


def size_problems(family, recipe, config) -> list[Problem]:
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
    text = family.text_length(recipe)
    absolute = config.get("use_learned_positional_embeddings") or \
        not config.get("use_rotary_positional_embeddings")
    if absolute and text != config.get("max_text_seq_length", text):
        problems.append(recipe.problem(
            "generate.max_sequence_length", f"{text} text tokens; this model's "
            f"positional embeddings take exactly {config['max_text_seq_length']}",
            hint=f"set it to {config['max_text_seq_length']} or leave it out"))
    return problems
