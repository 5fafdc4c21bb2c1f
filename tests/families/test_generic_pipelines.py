"""``family: generic`` on a pipeline a plugin family also runs, with a scheduler the
family does not use (diffusers' plain DDIM indexes host tables): a tiny random model
built with the component configurations of diffusers' own tests, saved with
``save_pretrained``, run by Porter from a recipe of ``model`` and ``generate`` keys
alone, and compared with plain diffusers from the same seed, frame for frame. Every
diffusers video pipeline class: tests/test_pipeline_matrix*.py."""

import importlib
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
import yaml

from porter import registry as registry_mod, recipe
from porter.commands.run import run
from porter.commands.validate import validate


@dataclass
class Case:
    builder: str  # tests/models/<module>.py: build_<module>_pipeline
    generate: dict  # the recipe's generate section
    call: dict  # the same settings under the pipeline's own names, for plain diffusers
    setup: dict = field(default_factory=dict)  # the recipe's setup section, if any


COMMON = {"prompt": "a cat", "seed": 0}

CASES = {
    "cogvideox_ddim": Case(  # diffusers' plain DDIMScheduler indexes host tables
        "cogvideox_ddim", {"height": 16, "width": 16, "frames": 8, "steps": 2,
                           "guidance_scale": 6.0, "max_sequence_length": 16},
        {"height": 16, "width": 16, "num_frames": 8, "num_inference_steps": 2,
         "guidance_scale": 6.0, "max_sequence_length": 16}),
}


def _pipeline(name: str):
    module = importlib.import_module(f"models.{CASES[name].builder}")
    return getattr(module, f"build_{CASES[name].builder}_pipeline")()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> the tiny pipeline saved as diffusers saves it (built once per module)."""
    made = {}

    def get(name):
        if name not in made:
            made[name] = tmp_path_factory.mktemp(name) / "ckpt"
            _pipeline(name).save_pretrained(made[name])
        return made[name]
    return get


def _recipe(name, source, tmp_path):
    case = CASES[name]
    text = {"model": {"family": "generic", "source": str(source)},
            "generate": {**COMMON, **case.generate}}
    if case.setup:
        text["setup"] = case.setup
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(text))
    return recipe.load(path, [f"output.dir={tmp_path / 'out'}"])


def _diffusers_frames(name, source):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(source, torch_dtype=torch.float32)
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            component.eval()
    for component, calls in CASES[name].setup.items():
        for method in calls:
            getattr(getattr(pipe, component), method)()
    frames = pipe(prompt=COMMON["prompt"], generator=torch.Generator().manual_seed(0),
                  output_type="np", **CASES[name].call).frames[0]
    return (np.asarray(frames) * 255).round().clip(0, 255).astype("uint8")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_plain_diffusers(name, saved, tmp_path):
    source = saved(name)
    loaded = _recipe(name, source, tmp_path)
    assert validate(loaded, registry_mod.loaded()) == []
    result = run(loaded, registry_mod.loaded(), progress=False)
    expected = _diffusers_frames(name, source)
    assert result.frames.shape == expected.shape
    assert np.abs(expected.astype(int) - result.frames.astype(int)).max() <= 1
