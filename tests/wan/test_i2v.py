"""Wan image-to-video: tiny end to end, and the same latents as diffusers."""

import pytest
import torch

from porter import registry as registry_mod, recipe
from porter.commands.run import run
from porter.port import checks

from support import RECIPES

I2V = """\
model: {family: wan, source: tiny, variant: i2v}
generate: {prompt: "a cat", image: frame.png, height: 32, width: 32, frames: 9, steps: 2,
           max_sequence_length: 16}
"""
IMAGE = RECIPES / "assets" / "first_frame.png"


@pytest.fixture
def i2v_recipe(write):
    write("frame.png", "")
    path = write("i2v.yaml", I2V)
    (path.parent / "frame.png").write_bytes(IMAGE.read_bytes())
    return path


def test_image_path_is_relative_to_the_recipe(i2v_recipe, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path.parent)  # elsewhere: the recipe's folder still counts
    loaded = recipe.load(i2v_recipe)
    assert loaded.file_path("generate.image", loaded.generate.image) == \
        i2v_recipe.parent / "frame.png"
    assert checks.recipe_problems(loaded, registry_mod.loaded()) == []
    from_cli = recipe.load(i2v_recipe, ["generate.image=frame.png"])
    assert from_cli.file_path("generate.image", "frame.png").parent == type(i2v_recipe)(".")


def test_image_rules(i2v_recipe):
    missing = recipe.load(i2v_recipe, ["generate.image=null"])
    [problem] = checks.recipe_problems(missing, registry_mod.loaded())
    assert problem.path == "generate.image" and "needs an image" in problem.message
    wrong = recipe.load(i2v_recipe, ["model.variant=t2v"])
    [problem] = checks.recipe_problems(wrong, registry_mod.loaded())
    assert "takes no image" in problem.message


@pytest.mark.slow
def test_tiny_i2v_matches_diffusers(i2v_recipe, tmp_path):
    from PIL import Image

    from porter_wan.tiny import build_i2v_pipeline

    loaded = recipe.load(i2v_recipe, [f"output.dir={tmp_path / 'out'}"])
    result = run(loaded, registry_mod.loaded(), progress=False)
    assert result.frames.shape == (9, 32, 32, 3)
    gen = loaded.generate
    pipe = build_i2v_pipeline()
    for module in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.image_encoder):
        module.eval()
    expected = pipe(image=Image.open(IMAGE).convert("RGB"), prompt=gen.prompt,
                    negative_prompt=gen.negative_prompt, height=gen.height, width=gen.width,
                    num_frames=gen.frames, num_inference_steps=gen.steps,
                    guidance_scale=gen.guidance_scale,
                    max_sequence_length=gen.max_sequence_length,
                    generator=torch.Generator().manual_seed(gen.seed),
                    output_type="latent").frames
    assert (result.latents - expected).abs().max() <= 1e-4
