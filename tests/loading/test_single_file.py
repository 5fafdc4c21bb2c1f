"""``model.transformer``: the transformer from one .safetensors file in diffusers' or
Wan's own key names, bfloat16, fp8 cast or scaled fp8, read tensor by tensor into its
shards; files that do not fit are refused from their headers, before loading."""

import numpy as np
import pytest
import torch
from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
from safetensors.torch import save_file

from porter import registry as registry_mod, recipe, runtime
from porter.errors import LoadError
from porter.port import passes
from porter.transforms.building import Building

from support import RECIPES
from support.processes import porter_calls
from support.single_file import dequantized, fp8, wan_names


@pytest.fixture(scope="module")
def state():
    """The tiny Wan transformer's weights (bfloat16) as diffusers names them."""
    from porter_wan.tiny import build_pipeline

    return {name: tensor.to(torch.bfloat16).contiguous() for name, tensor in
            build_pipeline().transformer.state_dict().items()}


@pytest.fixture(scope="module")
def files(state, tmp_path_factory):
    folder = tmp_path_factory.mktemp("single")
    made = {"diffusers": state, "wan": wan_names(state),
            "wan-fp8": fp8(wan_names(state), scaled=False),
            "wan-scaled-fp8": fp8(wan_names(state), scaled=True),
            "wan-scaled-fp8-rows": fp8(wan_names(state), scaled=True, rows=True)}
    paths = {}
    for name, tensors in made.items():
        paths[name] = folder / f"{name}.safetensors"
        save_file(tensors, paths[name])
    made["wan-pth"] = made["wan"]  # a PyTorch checkpoint, as the original release ships
    paths["wan-pth"] = folder / "wan.pth"
    torch.save(made["wan"], paths["wan-pth"])
    return paths, made


def test_the_wan_names_here_are_the_ones_diffusers_converts(state):
    converted = convert_wan_transformer_to_diffusers(dict(wan_names(state)))
    assert sorted(converted) == sorted(state)


def ported(*overrides):
    loaded = recipe.load(RECIPES / "wan-tiny-tp.yaml", ["model.dtype=bfloat16", *overrides])
    registry = registry_mod.loaded()
    building = Building(loaded, registry, registry.family("wan"), runtime.start(loaded))
    with building.stack:
        return passes.build(building)


@pytest.mark.parametrize("kind", ["diffusers", "wan", "wan-pth", "wan-fp8", "wan-scaled-fp8",
                                  "wan-scaled-fp8-rows"])
def test_each_file_gives_the_transformer_its_values(files, state, kind):
    """Each tensor read from the file into its shards on a dp=2 x tp=4 mesh: the file's
    values (an fp8 weight times its scale), in the recipe's dtype."""
    paths, made = files
    built = ported(f"model.transformer={paths[kind]}")
    assert built.placement.reports["transformer"]["from"] == "checkpoint"
    expected = dequantized(made[kind]) if "fp8" in kind else made[kind]
    if kind != "diffusers":
        expected = convert_wan_transformer_to_diffusers(
            {k.removeprefix("model.diffusion_model."): v for k, v in expected.items()})
    held = dict(built.modules["transformer"].state_dict())
    assert sorted(held) == sorted(state)
    for name, value in expected.items():
        got = np.asarray(held[name].jax()).astype(np.float32)
        assert np.array_equal(got, value.to(torch.bfloat16).float().numpy()), name
    assert set(built.ported().checkpoint["files"]) >= {"model.transformer"}


def test_a_scaled_fp8_file_missing_a_scale_is_refused(files, tmp_path):
    paths, made = files
    broken = dict(made["wan-scaled-fp8"])
    broken.pop("model.diffusion_model.blocks.1.ffn.0.scale_weight")
    save_file(broken, tmp_path / "broken.safetensors")
    with pytest.raises(LoadError, match=r"blocks\.1\.ffn\.0\.weight: fp8 with no "
                       "scale_weight in a scaled fp8 file"):
        ported(f"model.transformer={tmp_path / 'broken.safetensors'}")


def test_as_a_user_runs_it_refused_files_and_a_scaled_fp8_run(files, state, tmp_path):
    """A user's fresh process (one process for all: they differ only in arguments):
    `porter validate` refuses a file of another width, a missing file and a file that
    is neither safetensors nor a PyTorch checkpoint, each named with what is wrong; the file users hold for fp8
    (Wan's names, scaled fp8) runs with 8-bit matmuls, its record naming the file and
    the quantization."""
    import json

    wider = {name: torch.zeros(*(2 * d for d in t.shape), dtype=torch.bfloat16)
             if name.endswith("to_q.weight") else t for name, t in state.items()}
    save_file(wider, tmp_path / "wider.safetensors")
    (tmp_path / "model.pt").write_bytes(b"not a checkpoint of any kind")
    wider_file, absent, pickle = (tmp_path / "wider.safetensors",
                                  tmp_path / "absent.safetensors", tmp_path / "model.pt")
    paths, _ = files
    out = tmp_path / "run"
    *refused, ran = porter_calls(
        *[["validate", RECIPES / "wan-tiny.yaml", f"model.transformer={f}"]
          for f in (wider_file, absent, pickle)],
        ["run", RECIPES / "wan-tiny.yaml", "model.dtype=bfloat16",
         f"model.transformer={paths['wan-scaled-fp8']}", "quantize.format=fp8",
         f"output.dir={out}", "--no-progress"])
    for done in refused:
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "model.transformer: blocks.0.attn1.to_q.weight: shape [48, 48], the model's " \
        "blocks.0.attn1.to_q.weight is [24, 24]" in refused[0].stderr
    assert "is not a file" in refused[1].stderr
    assert "model.pt: not a zip-format PyTorch checkpoint" in refused[2].stderr
    assert ran.returncode == 0, ran.stderr
    record = json.loads((out / "run.json").read_text())
    assert record["checkpoint"]["quantize"]["format"] == "fp8"
    assert "model.transformer" in record["checkpoint"]["files"]
    assert (out / "video.mp4").stat().st_size > 0
