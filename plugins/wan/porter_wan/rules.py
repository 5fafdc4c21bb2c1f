"""What Wan's models need of a recipe beyond the shared checks (sizes, inputs): the
arguments a tiny model's configuration may set, the image and last frame each layout
takes or needs, a second guidance scale only for two experts."""

from __future__ import annotations

import inspect

from porter.errors import Problem


def problems(family, recipe) -> list[Problem]:
    found = config_problems(recipe)
    if found:
        return found
    layout = family.layout(recipe)
    if layout is None:  # no configuration at hand: the run checks what it downloads
        return []
    return image_problems(recipe, layout) + guidance_problems(recipe, layout)


def config_problems(recipe) -> list[Problem]:
    """``model.config`` keys WanTransformer3DModel does not take."""
    if not recipe.model.config:
        return []
    from diffusers import WanTransformer3DModel

    known = set(inspect.signature(WanTransformer3DModel.__init__).parameters) - {"self"}
    return [recipe.problem(f"model.config.{key}", f"WanTransformer3DModel has no argument "
                           f"{key!r}", hint="arguments: " + ", ".join(sorted(known)))
            for key in sorted(set(recipe.model.config) - known)]


def image_problems(recipe, layout) -> list[Problem]:
    gen, found = recipe.generate, []
    if layout.needs_image and gen.image is None:
        found.append(recipe.problem(
            "generate.image", "this image-to-video model needs an image (its first frame)",
            hint="generate.image: path/to/first_frame.png"))
    if gen.image is not None and not layout.takes_image:
        found.append(recipe.problem(
            "generate.image", "this text-to-video model takes no image",
            hint="leave generate.image out, or use an image-to-video model (tiny "
                 "variants: i2v, i2v-two-experts, ti2v, flf2v)"))
    if gen.last_image is not None:
        found += _last_image_problems(recipe, layout)
    elif layout.needs_last_image and gen.image is not None:
        found.append(recipe.problem(
            "generate.last_image", "this first-last-frame model needs a last frame too",
            hint="generate.last_image: path/to/last_frame.png"))
    for key in ("image", "last_image"):
        value = getattr(gen, key)
        if value is not None and not recipe.file_path(f"generate.{key}", value).is_file():
            found.append(recipe.problem(f"generate.{key}", f"{value!r} is not a file",
                                        hint=recipe.relative_paths(f"generate.{key}")))
    return found


def _last_image_problems(recipe, layout) -> list[Problem]:
    gen, found = recipe.generate, []
    if gen.frames < layout.temporal + 1:
        found.append(recipe.problem("generate.frames", f"a first and a last frame need at "
                                    f"least {layout.temporal + 1} frames",
                                    hint=f"frames: {layout.temporal + 1} or more"))
    if gen.image is None:
        found.append(recipe.problem("generate.last_image", "a last frame needs a first "
                                    "frame", hint="set generate.image too"))
    elif not layout.takes_last_image:
        found.append(recipe.problem(
            "generate.last_image", "this model takes no last frame",
            hint="leave generate.last_image out; first-last-frame models: Wan 2.1 FLF2V, "
                 "Wan 2.2 I2V-A14B (tiny variants flf2v, i2v-two-experts)"))
    return found


def guidance_problems(recipe, layout) -> list[Problem]:
    if recipe.generate.guidance_scale_2 is not None and layout.boundary_ratio is None:
        return [recipe.problem(
            "generate.guidance_scale_2", "only two-expert models (Wan 2.2 A14B) take a "
            "second guidance scale", hint="leave it out; guidance_scale applies to every "
            "step")]
    return []
