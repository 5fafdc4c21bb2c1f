"""CogVideoX plugin: tiny end to end against diffusers; frame rules; real recipes plan."""

import numpy as np
import pytest
import torch

from porter import registry as registry_mod, recipe
from porter.commands.run import run
from porter.port import checks, estimates

from support import RECIPES

TINY = RECIPES / "cogvideox-tiny.yaml"


@pytest.mark.slow
@pytest.mark.parametrize("variant,version", [("v1", "1.0"), ("v1.5", "1.5")])
def test_tiny_matches_diffusers(tmp_path, variant, version):
    from porter_cogvideox.tiny import build_pipeline

    loaded = recipe.load(TINY, [f"model.variant={variant}", "generate.steps=2",
                                f"output.dir={tmp_path}", "mesh.dp=2"])
    result = run(loaded, registry_mod.loaded(), progress=False)
    pipe = build_pipeline(version)
    for module in (pipe.transformer, pipe.vae, pipe.text_encoder):
        module.eval()
    gen = loaded.generate
    expected = pipe(gen.prompt, negative_prompt=gen.negative_prompt, height=gen.height,
                    width=gen.width, num_frames=gen.frames, num_inference_steps=gen.steps,
                    guidance_scale=gen.guidance_scale, max_sequence_length=16,
                    generator=torch.Generator().manual_seed(gen.seed),
                    output_type="np").frames[0]
    assert result.frames.shape == (9, 16, 16, 3)
    assert np.abs((expected * 255).round() - result.frames).max() <= 1
    assert [p["name"] for p in result.data["patches"]] == [
        "core.setitem", "core.deepcopy", "core.view_index", "core.type_as",
        "core.view_tolist", "core.view_of_view", "core.host_inplace",
        "core.block_mask", "core.flex_attention", "cogvideox.rope_cache"]


def test_bad_frame_counts_are_validation_errors():
    registry = registry_mod.loaded()
    [problem] = checks.recipe_problems(
        recipe.load(TINY, ["model.variant=v1.5", "generate.frames=13"]), registry)
    assert problem.path == "generate.frames" and "odd number of latent frames" in \
        problem.message and "try 9 or 17" in problem.hint
    [problem] = checks.recipe_problems(recipe.load(TINY, ["generate.frames=12"]), registry)
    assert "4n+1" in problem.message
    # the real 1.5 checkpoint's version comes from its official config
    real = RECIPES / "cogvideox1.5-5b.yaml"
    assert checks.recipe_problems(recipe.load(real, ["generate.frames=49"]), registry) == []
    [problem] = checks.recipe_problems(recipe.load(real, ["generate.frames=45"]), registry)
    assert "odd number of latent frames" in problem.message  # 45 -> 12 latent frames


@pytest.mark.parametrize("name", ["cogvideox-2b.yaml", "cogvideox-5b.yaml",
                                  "cogvideox1.5-5b.yaml", "cogvideox-5b-i2v.yaml"])
def test_real_recipes_plan_on_8_devices(name):
    loaded = recipe.load(RECIPES / name)
    built = estimates.build(loaded, registry_mod.loaded(), devices=8)
    assert built["problems"] == [] and built["mesh"] == {"dp": 2, "tp": 4}
    transformer = next(c for c in built["components"] if c["component"] == "transformer")
    assert transformer["bytes_per_device"] < transformer["bytes"] / 3  # mostly split 4 ways


@pytest.mark.slow
def test_tiny_image_to_video_matches_diffusers(tmp_path):
    from PIL import Image

    from porter_cogvideox.tiny import build_pipeline

    image = RECIPES / "assets" / "first_frame.png"
    loaded = recipe.load(TINY, ["model.variant=v1-i2v", f"generate.image={image}",
                                "generate.steps=2", f"output.dir={tmp_path}"])
    result = run(loaded, registry_mod.loaded(), progress=False)
    pipe = build_pipeline(image_to_video=True)
    for module in (pipe.transformer, pipe.vae, pipe.text_encoder):
        module.eval()
    gen = loaded.generate
    expected = pipe(image=Image.open(image).convert("RGB"), prompt=gen.prompt,
                    negative_prompt=gen.negative_prompt, height=gen.height, width=gen.width,
                    num_frames=gen.frames, num_inference_steps=gen.steps,
                    guidance_scale=gen.guidance_scale, max_sequence_length=16,
                    generator=torch.Generator().manual_seed(gen.seed),
                    output_type="np").frames[0]
    assert np.abs((expected * 255).round() - result.frames).max() <= 1


def test_generate_extra_is_read_only_where_a_family_reads_it():
    """A staged family refuses the generate.extra keys it does not read (Wan ignored
    them silently); CogVideoX reads use_dynamic_cfg."""
    registry = registry_mod.loaded()
    assert checks.recipe_problems(recipe.load(TINY, ["generate.extra={use_dynamic_cfg: true}"]),
                                  registry) == []
    [problem] = checks.recipe_problems(recipe.load(TINY, ["generate.extra={eta: 0.5}"]),
                                       registry)
    assert problem.path == "generate.extra.eta" and problem.hint == "it reads: use_dynamic_cfg"
    [problem] = checks.recipe_problems(recipe.load(RECIPES / "wan-tiny.yaml",
                                                   ["generate.extra={shift: 3}"]), registry)
    assert problem.path == "generate.extra.shift" and "family 'wan' reads no" in problem.message
