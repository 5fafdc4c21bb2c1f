"""The shipped few-step recipes, each as its tiny twin: the recipe's scheduler, schedule,
guidance and LoRA layout on the tiny model of its layout, with LoRA files written in
the key format the recipe's adapters are published in. Each twin's latents equal plain
diffusers' given the same LoRA files and scheduler, driven on the same schedule
through its scheduler."""

import json

import pytest
import yaml

from porter import registry as registry_mod, recipe
from porter.commands.run import run
from porter.commands.validate import validate

from support import RECIPES
from support.hostile import seed_data
from support.lora import in_format
from support.references import wan_latents

pytestmark = pytest.mark.slow

#: shipped recipe -> (the tiny layout it runs on, the format its LoRAs are published in)
SETUPS = {
    "wan14b-4step.yaml": ("t2v", "lightx2v"),
    "wan-i2v-14b-4step.yaml": ("i2v", "lightx2v"),
    "wan22-a14b-4step.yaml": ("t2v-two-experts", "comfyui"),
    "wan22-i2v-a14b-4step.yaml": ("i2v-two-experts", "comfyui"),
    "wan1.3b-causvid.yaml": ("t2v", "musubi"),
}


def twin(name: str, tmp_path):
    """The shipped recipe's few-step settings on its tiny layout, a LoRA file of its
    format in place of each adapter it names."""
    variant, style = SETUPS[name]
    shipped = seed_data(name)  # `porter validate` of each: tests/recipe/test_recipe.py
    gen = shipped["generate"]
    assert gen["guidance_scale"] == 1.0 and shipped["lora"]  # one pass a step, distilled
    generate = {"prompt": "a cat", "height": 32, "width": 32, "frames": 9,
                "max_sequence_length": 16, "steps": gen["steps"],
                **{k: gen[k] for k in ("sigmas", "timesteps", "guidance_scale",
                                       "guidance_scale_2") if k in gen}}
    if variant.startswith("i2v"):
        (tmp_path / "first.png").write_bytes((RECIPES / "assets" / "first_frame.png")
                                             .read_bytes())
        generate["image"] = "first.png"
    adapters = [{"file": in_format(tmp_path, style, variant, seed=index + 1).name,
                 "components": adapter.get("components", ["transformer"])}
                for index, adapter in enumerate(shipped["lora"])]
    data = {"model": {"family": "wan", "source": "tiny", "variant": variant},
            "generate": generate, "scheduler": shipped["scheduler"], "lora": adapters,
            "output": {"dir": str(tmp_path / "out")}}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return recipe.load(path)


@pytest.mark.parametrize("name", sorted(SETUPS))
def test_twin_matches_diffusers(name, tmp_path):
    loaded = twin(name, tmp_path)
    assert validate(loaded, registry_mod.loaded()) == []
    result = run(loaded, registry_mod.loaded(), progress=False)
    expected = wan_latents(loaded, **{k: getattr(loaded.generate, k) for k in
                                      ("sigmas", "timesteps")
                                      if getattr(loaded.generate, k) is not None})
    assert (result.latents - expected).abs().max() <= 1e-4
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    timesteps = record["schedule"]["timesteps"]
    assert len(timesteps) == loaded.generate.steps == 4
    if loaded.generate.sigmas:  # 1, .75, .5, .25 shifted by 5: Lightning's timesteps
        assert timesteps == pytest.approx([1000.0, 937.5, 833.333, 625.0], abs=1e-3)
    assert [a["modules"] for a in record["checkpoint"]["lora"]] and all(
        a["modules"] > 0 for a in record["checkpoint"]["lora"])

