"""Single files that must not load as they look: scaled fp8 whose scales are gone (it
reads as an fp8 cast, its weights hundreds of times too large), each refusal with a hint
of its own and every one counted; and what a file was read as, in the run record."""

import json

import pytest
import torch
from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
from safetensors.torch import save_file

from porter.errors import LoadError
from porter.loading import single_file
from porter.loading.weights import SCALES_LOST

from support import RECIPES
from support.processes import porter_calls
from support.single_file import fp8, wan_names

CONVERT = convert_wan_transformer_to_diffusers


@pytest.fixture(scope="module")
def transformer():
    from porter_wan.tiny import build_pipeline

    return build_pipeline().transformer


@pytest.fixture(scope="module")
def files(transformer, tmp_path_factory):
    """The tiny Wan's transformer as files users hold, some broken as they break."""
    state = {name: tensor.to(torch.bfloat16).contiguous()
             for name, tensor in transformer.state_dict().items()}
    scaled = fp8(wan_names(state), scaled=True)
    cast = fp8(wan_names(state), scaled=False)
    weights = [name for name in scaled if name.endswith(".scale_weight")]
    big = "model.diffusion_model.blocks.1.ffn.0.weight"  # not the smallest fp8 tensor
    made = {
        "diffusers": state, "cast": cast, "scaled": scaled,
        "scaled-rows": fp8(wan_names(state), scaled=True, rows=True),
        # scales and marker gone: every value reads as it is, up to 448
        "stripped": {n: t for n, t in scaled.items() if n not in weights + ["scaled_fp8"]},
        # the marker kept, every scale gone: 26 problems of one kind
        "scales-lost": {n: t for n, t in scaled.items() if n not in weights},
        # a cast file with one scaled weight in it, its scale gone
        "one-big": {**cast, big: scaled[big]},
    }
    folder = tmp_path_factory.mktemp("refusals")
    for name, tensors in made.items():
        save_file(tensors, folder / f"{name}.safetensors")
    return {name: folder / f"{name}.safetensors" for name in made}, len(weights)


def test_scaled_fp8_without_its_scales_is_refused_naming_a_tensor(files, transformer):
    """Read as a cast, such a file gave the tiny Wan latents 5.6e9 at the last step,
    finite, and exit 0. One fp8 weight (the smallest) is read to tell: scaled fp8 puts
    every weight's largest value at the format's limit."""
    paths, _ = files
    [refused] = single_file.problems(paths["stripped"], transformer, CONVERT)
    assert refused.text.startswith("blocks.")
    assert "float8_e4m3fn values up to 448 with no scale" in refused.text
    assert refused.hint == SCALES_LOST
    for kind in ("cast", "scaled", "scaled-rows", "diffusers"):
        assert single_file.problems(paths[kind], transformer, CONVERT) == [], kind


def test_each_fp8_weight_is_checked_as_it_is_read(files, transformer):
    """A weight the check of one tensor does not see is found as placement reads it,
    and placement refuses it (on every process together), naming the model's tensor
    and the file; the others read as they are."""
    from porter.transforms.placement import refuse_unscaled

    paths, _ = files
    assert single_file.problems(paths["one-big"], transformer, CONVERT) == []
    weights = single_file.located(paths["one-big"], transformer, CONVERT)
    weights.read("blocks.1.ffn.net.0.proj.weight", torch.bfloat16)
    assert weights.read("blocks.0.ffn.net.0.proj.weight", torch.bfloat16).abs().max() < 10
    assert list(weights.unscaled) == ["blocks.1.ffn.net.0.proj.weight"]
    with pytest.raises(LoadError, match=r"one-big\.safetensors: blocks\.1\.ffn\.net\.0\.proj"
                       r"\.weight: float8_e4m3fn values up to 448") as info:
        refuse_unscaled(list(weights.unscaled.values()))
    assert info.value.hint == SCALES_LOST
    refuse_unscaled([])  # nothing found anywhere: nothing refused


def test_each_refusal_has_a_hint_of_its_own(files, transformer):
    """A weight without its scale is not asked whether it is the model's transformer;
    a tensor of another shape is."""
    paths, scales = files
    lost = single_file.problems(paths["scales-lost"], transformer, CONVERT)
    assert len(lost) == scales == 26
    assert {problem.hint for problem in lost} == {
        "the file has lost this weight's scale_weight: use the file as published, each "
        "fp8 weight beside its scale_weight"}
    wider = dict(transformer.state_dict())
    wider["proj_out.weight"] = torch.zeros(2 * wider["proj_out.weight"].shape[0],
                                           wider["proj_out.weight"].shape[1])
    save_file({n: t.contiguous() for n, t in wider.items()},
              paths["diffusers"].parent / "wider.safetensors")
    [shape] = single_file.problems(paths["diffusers"].parent / "wider.safetensors",
                                   transformer, CONVERT)
    assert "shape" in shape.text and "the same variant and size" in shape.hint
    assert "WanTransformer3DModel" in shape.hint


def test_what_a_file_is_read_as(files, transformer):
    paths, _ = files
    read_as = {kind: single_file.located(paths[kind], transformer, CONVERT).read_as
               for kind in ("diffusers", "cast", "scaled", "scaled-rows")}
    converted = "the original release's, converted by convert_wan_transformer_to_diffusers"
    assert read_as["diffusers"] == {"format": "unquantized", "dtypes": ["bfloat16"],
                                    "names": "the model's own"}
    assert read_as["cast"] == {"format": "fp8 cast",
                               "dtypes": ["bfloat16", "float8_e4m3fn"], "names": converted}
    assert read_as["scaled"]["format"] == "scaled fp8, a scale_weight per weight"
    assert read_as["scaled-rows"]["format"] == "scaled fp8, a scale_weight per row"


@pytest.mark.slow
def test_as_a_user_validates_and_runs_them(files, tmp_path):
    """A user's fresh process: `porter validate` refuses the file whose scales are gone
    naming a tensor, and counts all 26 missing scales with a hint about scales; `porter
    run` of an fp8 cast records that it read one, in Wan's own names."""
    paths, _ = files
    wan = RECIPES / "wan-tiny.yaml"
    stripped, lost, ran = porter_calls(
        ["validate", wan, f"model.transformer={paths['stripped']}"],
        ["validate", wan, f"model.transformer={paths['scales-lost']}"],
        ["run", wan, "model.dtype=bfloat16", f"model.transformer={paths['cast']}",
         f"output.dir={tmp_path / 'cast'}", "--no-progress"])
    assert stripped.returncode == 2 and "Traceback" not in stripped.stderr
    assert "recipe has 1 problem" in stripped.stderr
    assert "float8_e4m3fn values up to 448 with no scale" in stripped.stderr
    assert f"hint: {SCALES_LOST}" in stripped.stderr
    assert lost.returncode == 2 and "recipe has 8 problems" in lost.stderr
    assert "; and 18 more (26 problems with scales-lost.safetensors)" in lost.stderr
    assert "same variant and size" not in lost.stderr
    assert ran.returncode == 0, ran.stderr
    record = json.loads((tmp_path / "cast" / "run.json").read_text())
    assert record["checkpoint"]["read_as"]["model.transformer"] == {
        "format": "fp8 cast", "dtypes": ["bfloat16", "float8_e4m3fn"],
        "names": "the original release's, converted by convert_wan_transformer_to_diffusers"}
