"""The layouts of published checkpoints Porter ships (porter/loading/layouts/): what
validate, plan and compile read of a hub id with nothing downloaded. Each builds on
the meta device at the published size, and its recipe checks out for its chips."""

import pytest
import torch

from porter import registry as registry_mod, recipe
from porter.commands.validate import validate
from porter.loading import abstract, published

from support import RECIPES

#: parameters of each component, as the published configurations build them (the
#: transformer and connectors are LTX-2.3's "22B"; Gemma 3 12B, its lm_head tied)
LTX23 = {"transformer": 18_988_838_144, "connectors": 3_172_227_584,
         "text_encoder": 12_187_325_040}
#: MiniMax-H3's "33B DiT" (61.7 GB in bfloat16, twice: the reference-to-video half),
#: Qwen3-VL 32B (62.1 GB) and its 2.6 B video VAE
MINIMAX_H3 = {"transformer": 33_122_992_896, "transformer_ref": 33_122_992_896,
              "text_encoder": 33_357_390_064, "vae": 2_603_868_984, "audio_vae": 151_321_489}
#: Wan-Animate-2 "14B": Wan 2.1 I2V 14B's shape; UMT5-XXL, CLIP ViT-H/14, Wan 2.1's VAE
WAN_ANIMATE2 = {"transformer": 16_394_878_784, "text_encoder": 5_680_910_336,
                "image_encoder": 630_766_080, "vae": 126_892_531}
#: recipe -> the parameters of its published components
PUBLISHED = {"ltx23.yaml": LTX23, "minimax-h3.yaml": MINIMAX_H3,
             "wan-animate2.yaml": WAN_ANIMATE2}


def test_every_layout_is_a_diffusers_folder():
    assert published.shipped() == ["MiniMaxAI/MiniMax-H3",
                                   "Wan-AI/Wan2.2-Animate-2-14B-Diffusers",
                                   "diffusers/LTX-2.3-Diffusers"]
    assert published.layout("someone/else") is None


def test_ltx23_builds_at_its_published_size():
    loaded = recipe.load(RECIPES / "ltx23.yaml")
    modules = abstract.components(registry_mod.loaded().family("generic"), loaded)
    assert set(modules) == {"transformer", "connectors", "text_encoder", "vae", "audio_vae",
                            "vocoder"}
    counts = {name: sum(p.numel() for p in modules[name].parameters()) for name in LTX23}
    assert counts == LTX23
    assert all(p.device.type == "meta" for p in modules["transformer"].parameters())
    assert modules["transformer"].dtype == torch.bfloat16


@pytest.mark.parametrize("name", ["minimax-h3.yaml", "wan-animate2.yaml"])
def test_each_modular_layout_builds_at_its_published_size(name):
    loaded = recipe.load(RECIPES / name)
    modules = abstract.components(registry_mod.loaded().family("generic"), loaded)
    counts = {n: sum(p.numel() for p in modules[n].parameters()) for n in PUBLISHED[name]}
    assert counts == PUBLISHED[name]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_recipe_validates_for_eight_chips(name):
    loaded = recipe.load(RECIPES / name)
    assert validate(loaded, registry_mod.loaded(), devices=8) == []
    assert any(p.path.startswith("mesh") for p in validate(loaded, registry_mod.loaded(),
                                                           devices=4))


@pytest.mark.slow
def test_ltx23_programs_are_found_with_nothing_downloaded():
    """porter compile's dry run from the shipped layout: the transformer at 768x512 and
    121 frames (16 latent frames of 16 x 24: 6144 video tokens) in every step, and one
    decode of those latents."""
    from porter.aot import dry_run, targets
    from porter.aot import port as abstract_port

    loaded = recipe.load(RECIPES / "ltx23.yaml")
    port = abstract_port.build(loaded, registry_mod.loaded(), targets.named("v6e-8"))
    found = dry_run.programs(port)
    # its Gemma 3 text encoder compiled as a run compiles it: no key/value cache returned
    gemma = port.components["text_encoder"].module.config.get_text_config(decoder=True)
    assert gemma.use_cache is False
    assert "text_encoder.forward" in {p.name for p in found if p.stage == "encode"}
    steps = [p for p in found if p.stage == "denoise"]
    assert {p.name for p in steps} == {"transformer.forward"}
    assert sum(p.calls for p in steps) % 30 == 0 and all(p.per_step for p in steps)
    assert all(p.kwargs["hidden_states"].shape[1:] == (6144, 128) for p in steps)
    [decode] = [p for p in found if p.stage == "decode"]
    assert decode.name == "vae.decode" and decode.args[0].shape == (1, 128, 16, 16, 24)


@pytest.mark.slow
@pytest.mark.extra  # its VAE's decode runs on the meta device op by op: two minutes
def test_minimax_h3_programs_are_found_with_nothing_downloaded():
    """The modular layout's dry run (its processor the stand-in without torchvision):
    at 1344x768 and 124 frames, 37,296 video tokens, 414 of stereo sound; the schedule
    counts its final sigma as a step (49 transformer calls in 50 steps)."""
    from porter.aot import dry_run, targets
    from porter.aot import port as abstract_port

    loaded = recipe.load(RECIPES / "minimax-h3.yaml")
    found = dry_run.programs(abstract_port.build(loaded, registry_mod.loaded(),
                                                 targets.named("v6e-8")))
    steps = [p for p in found if p.stage == "denoise"]
    assert {p.name for p in steps} == {"transformer.forward"}
    assert sum(p.calls for p in steps) == 49
    assert sum(p.per_step for p in steps) == pytest.approx(49 / 50)
    assert all(p.kwargs["hidden_states"].shape == (1, 37296, 96) for p in steps)
    assert all(p.kwargs["audio_hidden_states"].shape == (1, 414, 32) for p in steps)
    [decode] = [p for p in found if p.stage == "decode"]
    assert decode.name == "vae.decode" and decode.args[0].shape == (1, 24, 37, 48, 84)
