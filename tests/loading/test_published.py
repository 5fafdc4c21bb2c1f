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


def test_every_layout_is_a_diffusers_folder():
    assert published.shipped() == ["diffusers/LTX-2.3-Diffusers"]
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


def test_ltx23_recipe_validates_for_eight_chips():
    loaded = recipe.load(RECIPES / "ltx23.yaml")
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
    found = dry_run.programs(abstract_port.build(loaded, registry_mod.loaded(),
                                                 targets.named("v6e-8")))
    steps = [p for p in found if p.stage == "denoise"]
    assert {p.name for p in steps} == {"transformer.forward"}
    assert sum(p.calls for p in steps) % 30 == 0 and all(p.per_step for p in steps)
    assert all(p.kwargs["hidden_states"].shape[1:] == (6144, 128) for p in steps)
    [decode] = [p for p in found if p.stage == "decode"]
    assert decode.name == "vae.decode" and decode.args[0].shape == (1, 128, 16, 16, 24)
