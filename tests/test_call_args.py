"""The generic family's pipeline call comes from the pipeline's own signature."""

import pytest

from porter import recipe
from porter.recipe import call_args

BASE = """\
model: {family: generic, source: tiny}
generate: {prompt: "a cat", height: 32, width: 32, frames: 9, steps: 2%s}
"""


def load(write, more="", *overrides):
    return recipe.load(write("r.yaml", BASE % more), list(overrides))


def pipeline(name):
    import diffusers
    return getattr(diffusers, name)


@pytest.mark.parametrize("name, frames", [("LTXPipeline", "num_frames"),
                                          ("LattePipeline", "video_length"),
                                          ("SanaVideoPipeline", "frames")])
def test_frames_go_under_the_pipelines_own_name(write, name, frames):
    kwargs = call_args.kwargs(load(write), pipeline(name))
    assert kwargs[frames] == 9 and kwargs["num_inference_steps"] == 2
    assert {"num_frames", "video_length", "frames"} & set(kwargs) == {frames}


def test_settings_left_to_their_defaults_are_not_passed(write):
    """A pipeline's own negative prompt, guidance scale and text length stand."""
    kwargs = call_args.kwargs(load(write), pipeline("LTXPipeline"))
    assert not {"negative_prompt", "guidance_scale", "max_sequence_length", "image"} \
        & set(kwargs)
    kwargs = call_args.kwargs(load(write, ", negative_prompt: '', guidance_scale: 3.0"),
                              pipeline("LTXPipeline"))
    assert kwargs["negative_prompt"] == "" and kwargs["guidance_scale"] == 3.0
    assert call_args.kwargs(load(write, "", "generate.max_sequence_length=64"),
                            pipeline("LTXPipeline"))["max_sequence_length"] == 64
    assert kwargs["generator"].initial_seed() == 0


def test_a_setting_the_pipeline_does_not_take_is_refused(write):
    found = call_args.problems(load(write, ", max_sequence_length: 64"),
                               pipeline("LattePipeline"))
    assert [p.path for p in found] == ["generate.max_sequence_length"]
    assert "LattePipeline takes no max_sequence_length argument" in found[0].message
    assert "video_length" in found[0].hint


def test_extra_keys_are_checked_against_the_signature(write):
    loaded = load(write, ", extra: {decode_timestpe: 0.03, num_frames: 9, "
                         "output_type: pil, decode_timestep: 0.05}")
    found = {p.path: p for p in call_args.problems(loaded, pipeline("LTXPipeline"))}
    assert set(found) == {"generate.extra.decode_timestpe", "generate.extra.num_frames",
                          "generate.extra.output_type"}
    assert "did you mean 'decode_timestep'?" in found["generate.extra.decode_timestpe"].hint
    assert "set generate.frames instead" in found["generate.extra.num_frames"].hint
    assert call_args.kwargs(loaded, pipeline("LTXPipeline"))["decode_timestep"] == 0.05


def test_validate_reports_signature_problems_for_a_local_checkpoint(write, tmp_path):
    from porter import checks, plugins
    from models.ltx import build_ltx_pipeline

    source = tmp_path / "ltx"
    build_ltx_pipeline().save_pretrained(source)
    loaded = recipe.load(write("r.yaml", BASE.replace("source: tiny", f"source: {source}")
                               % ", extra: {video_lenght: 9}"))
    found = checks.recipe_problems(loaded, plugins.registry())
    assert [p.path for p in found] == ["generate.extra.video_lenght"]
