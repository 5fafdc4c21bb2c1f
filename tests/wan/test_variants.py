"""Every Wan layout: a Porter run gives the latents plain diffusers gives from the
same seed (tiny models: Wan 2.2 I2V-A14B with its second guidance scale, TI2V-5B
in text and image mode, Wan 2.1 first-last-frame), and the rules that keep a
recipe from asking a model for what it cannot do."""

import pytest

from porter import registry as registry_mod, recipe
from porter.commands.run import run
from porter.port import checks

from support import RECIPES
from support.references import wan_latents

FIRST = RECIPES / "assets" / "first_frame.png"
LAST = RECIPES / "assets" / "last_frame.png"

CASES = {
    # two experts, the first frame as latents only; the switch falls inside 6 steps
    "i2v-two-experts": ("image: first.png, guidance_scale: 5.0, guidance_scale_2: 3.0, "
                        "steps: 6, height: 32, width: 32"),
    "ti2v-text": "steps: 3, height: 64, width: 64",
    "ti2v-image": "image: first.png, steps: 3, height: 64, width: 64",
    "flf2v": "image: first.png, last_image: last.png, steps: 3, height: 32, width: 32",
}


def recipe_text(variant: str, generate: str) -> str:
    return (f"model: {{family: wan, source: tiny, variant: {variant}}}\n"
            f"generate: {{prompt: 'a cat', frames: 9, max_sequence_length: 16, {generate}}}\n")


@pytest.fixture
def make(tmp_path):
    (tmp_path / "first.png").write_bytes(FIRST.read_bytes())
    (tmp_path / "last.png").write_bytes(LAST.read_bytes())

    def _make(variant: str, generate: str, *overrides: str):
        path = tmp_path / f"{variant}.yaml"
        path.write_text(recipe_text(variant, generate))
        return recipe.load(path, [f"output.dir={tmp_path / 'out'}", *overrides])
    return _make


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_diffusers(case, make):
    variant = case.removesuffix("-text").removesuffix("-image")
    loaded = make(variant, CASES[case])
    assert checks.recipe_problems(loaded, registry_mod.loaded()) == []
    result = run(loaded, registry_mod.loaded(), progress=False)
    expected = wan_latents(loaded)
    assert result.latents.shape == expected.shape
    assert (result.latents - expected).abs().max() <= 1e-4


@pytest.mark.slow
def test_guidance_free_runs_one_pass_per_step(make, monkeypatch):
    """guidance_scale 1.0 (step-distilled LoRAs): no negative prompt, one call a step."""
    from porter_wan.family import WanFamily

    loaded = make("t2v", "steps: 3, height: 32, width: 32, guidance_scale: 1.0")
    calls = []
    original = WanFamily.call

    def counting(self, model, *args, **kwargs):
        calls.append(1)
        return original(self, model, *args, **kwargs)
    monkeypatch.setattr(WanFamily, "call", counting)
    result = run(loaded, registry_mod.loaded(), progress=False)
    assert len(calls) == 3
    assert (result.latents - wan_latents(loaded)).abs().max() <= 1e-4


def test_plan_counts_one_pass_without_guidance(make):
    family = registry_mod.loaded().family("wan")
    guided = make("t2v", "steps: 3, height: 32, width: 32, guidance_scale: 5.0")
    free = make("t2v", "steps: 3, height: 32, width: 32, guidance_scale: 1.0")
    config = dict(family.build_tiny(guided).transformer.config)
    assert family.estimates(guided, config)["flops_per_step"] == \
        2 * family.estimates(free, config)["flops_per_step"]


PROBLEMS = [
    ("t2v", "image: first.png", "generate.image", "takes no image"),
    ("i2v", "", "generate.image", "needs an image"),
    ("i2v-two-experts", "", "generate.image", "needs an image"),
    ("flf2v", "image: first.png", "generate.last_image", "needs a last frame"),
    ("ti2v", "image: first.png, last_image: last.png", "generate.last_image",
     "takes no last frame"),
    ("t2v", "last_image: last.png", "generate.last_image", "needs a first frame"),
    ("i2v", "image: nothing.png", "generate.image", "is not a file"),
    ("t2v", "guidance_scale_2: 2.0", "generate.guidance_scale_2", "two-expert"),
    # Wan 2.1 I2V: its CLIP tokens take one image
    ("i2v", "image: first.png, last_image: last.png", "generate.last_image",
     "takes no last frame"),
    ("ti2v", "", "generate.height", "multiple of 32"),
]


@pytest.mark.parametrize("variant,generate,path,message", PROBLEMS)
def test_recipes_that_ask_too_much_are_refused(variant, generate, path, message, make):
    size = "height: 48, width: 64" if variant == "ti2v" and not generate else \
        "height: 32, width: 32" if variant != "ti2v" else "height: 64, width: 64"
    loaded = make(variant, ", ".join(x for x in (size, "steps: 1", generate) if x))
    problems = checks.recipe_problems(loaded, registry_mod.loaded())
    assert [p.path for p in problems] == [path], problems
    assert message in problems[0].message


@pytest.mark.slow
@pytest.mark.parametrize("name", ["wan22-i2v-tiny.yaml", "wan22-ti2v-tiny.yaml",
                                  "wan-flf2v-tiny.yaml", "wan-lora-tiny.yaml"])
def test_verify_passes_on_each_tiny_recipe(name):
    from porter.commands.verify import verify

    result = verify(recipe.load(RECIPES / name), registry_mod.loaded())
    assert result["ok"] and result["output"]["max_rel"] <= 1e-5


def test_a_last_frame_needs_room(make):
    loaded = make("i2v-two-experts", "image: first.png, last_image: last.png, steps: 1, "
                  "height: 32, width: 32", "generate.frames=1")
    [problem] = checks.recipe_problems(loaded, registry_mod.loaded())
    assert problem.path == "generate.frames" and "at least 5 frames" in problem.message


def test_an_unknown_hub_model_is_not_judged_by_a_guessed_layout(make):
    """No configuration and nothing cached: the image rules wait for the run."""
    loaded = make("i2v", "image: first.png, steps: 1, height: 32, width: 32",
                  "model.source=SomeOrg/some-wan-i2v-finetune", "model.variant=null")
    assert checks.recipe_problems(loaded, registry_mod.loaded()) == []
