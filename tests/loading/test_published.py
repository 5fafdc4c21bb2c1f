"""The layouts of published checkpoints Porter ships (porter/loading/layouts/): what
validate, plan and compile read of a hub id with nothing downloaded. Each builds on
the meta device at the published size, and its recipe checks out for its chips."""

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
