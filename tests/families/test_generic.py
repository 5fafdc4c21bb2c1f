"""model.family: generic runs a diffusers video pipeline no plugin knows (tiny LTX-Video)."""

import numpy as np
import pytest
import torch

from porter import registry as registry_mod, recipe
from porter.commands.run import run
from porter.commands.validate import validate
from porter.errors import UsageError
from porter.port import checks

from models.ltx import build_ltx_pipeline

GENERIC = """\
model: {{family: generic, source: {source}, pipeline: LTXPipeline}}
generate: {{prompt: "a cat", height: 32, width: 32, frames: 9, steps: 2, guidance_scale: 3.0,
           max_sequence_length: 16}}
compile:
  transformer:   # LTX takes the latent grid as Python ints: they must be static
    methods: [forward]
    static_argnames: [return_dict, num_frames, height, width, rope_interpolation_scale]
  vae: {{methods: [decode]}}
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ltx") / "ckpt"
    build_ltx_pipeline().save_pretrained(path)
    return path


def test_validates_and_plans_from_the_checkpoint_config(checkpoint, write):
    from porter.port import estimates
    loaded = recipe.load(write("ltx.yaml", GENERIC.format(source=checkpoint)))
    assert validate(loaded, registry_mod.loaded()) == []
    built = estimates.build(loaded, registry_mod.loaded(), devices=1)
    assert {c["component"] for c in built["components"]} == {"transformer", "vae",
                                                             "text_encoder"}


@pytest.mark.slow
def test_tiny_ltx_end_to_end_matches_diffusers(checkpoint, write, tmp_path):
    loaded = recipe.load(write("ltx.yaml", GENERIC.format(source=checkpoint)),
                         [f"output.dir={tmp_path / 'out'}", "output.latents=true"])
    result = run(loaded, registry_mod.loaded(), progress=False)
    settings = dict(  # no negative_prompt: the recipe leaves it to LTX
        prompt="a cat", height=32, width=32, num_frames=9,
        num_inference_steps=2, guidance_scale=3.0, max_sequence_length=16)
    expected = build_ltx_pipeline()(**settings, generator=torch.Generator().manual_seed(0),
                                    output_type="np").frames[0]
    assert result.frames.shape == (9, 32, 32, 3) and result.video.exists()
    assert np.abs((expected * 255).round() - result.frames).max() <= 1
    # the final latents, caught by the pipeline's step callback, are diffusers' own
    latents = build_ltx_pipeline()(**settings, generator=torch.Generator().manual_seed(0),
                                   output_type="latent").frames
    from safetensors.torch import load_file
    written = load_file(tmp_path / "out" / "latents.safetensors")["latents"]
    assert result.data["outputs"]["latents"] == "latents.safetensors"
    assert written.shape == latents.shape and (written - latents).abs().max() < 1e-3


def test_generic_mistakes(checkpoint, write):
    text = GENERIC.format(source=checkpoint)
    found = {p.path: p for p in checks.recipe_problems(
        recipe.load(write("bad.yaml", text.replace("LTXPipeline", "os.system")),
                    ["model.source=tiny"]), registry_mod.loaded())}
    assert "no tiny model" in found["model.source"].message
    assert "not a diffusers pipeline class" in found["model.pipeline"].message
    with pytest.raises(UsageError, match="--stage and --resume"):
        run(recipe.load(write("ok.yaml", text)), registry_mod.loaded(), progress=False,
            stage="encode")


def test_setup_calls_are_checked_and_made(checkpoint, write):
    """``setup`` calls diffusers' own set-up methods from an allowlist; validate refuses
    others, methods the component lacks, and parameters the method does not take."""
    from porter import loading
    from porter.transforms import setup

    text = GENERIC.format(source=checkpoint)
    good = recipe.load(write("good.yaml", text + """\
setup:
  vae: [enable_tiling, {name: enable_slicing}]
"""))
    assert validate(good, registry_mod.loaded()) == []
    pipe = loading.load_pipeline(registry_mod.loaded().family("generic"), good)
    assert setup.apply(pipe, good) == ["vae.enable_tiling", "vae.enable_slicing"]
    assert pipe.vae.use_tiling and pipe.vae.use_slicing

    bad = recipe.load(write("bad.yaml", text + """\
setup:
  vae: [enable_tilling, {name: enable_tiling, params: {tile_size: 3}}]
  transformer: [enable_slicing]
  unet: [enable_tiling]
"""))
    found = {p.path: p for p in validate(bad, registry_mod.loaded())}
    assert "did you mean 'enable_tiling'" in found["setup.vae.0"].hint
    assert "tile_size" in found["setup.vae.1.params"].message
    assert "tile_sample_min_height" in found["setup.vae.1.params"].hint
    assert "has no method 'enable_slicing'" in found["setup.transformer.0"].message
    assert "no component 'unet'" in found["setup.unet"].message


def test_a_draw_without_a_generator_repeats_from_the_seed(checkpoint, write, monkeypatch):
    """A pipeline drawing noise with no generator (I2VGen-XL's VAE encode samples its
    latent distribution so) draws from the device's key, which every draw moves on:
    the second call of one port gives the same frames as the first, and another seed
    others."""
    from diffusers import LTXPipeline

    from porter import api

    prepare = LTXPipeline.prepare_latents

    def noisier(self, *args, **kwargs):
        latents = prepare(self, *args, **kwargs)
        return latents + 0.5 * torch.randn(latents.shape, device=latents.device)

    monkeypatch.setattr(LTXPipeline, "prepare_latents", noisier)
    port = api.load(write("ltx.yaml", GENERIC.format(source=checkpoint)))
    first, second = port.generate().frames, port.generate().frames
    assert np.array_equal(first, second)
    assert not np.array_equal(first, port.generate(seed=1).frames)

