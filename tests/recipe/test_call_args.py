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
    from porter import registry as registry_mod
    from porter.port import checks

    from models.ltx import build_ltx_pipeline

    source = tmp_path / "ltx"
    build_ltx_pipeline().save_pretrained(source)
    loaded = recipe.load(write("r.yaml", BASE.replace("source: tiny", f"source: {source}")
                               % ", extra: {video_lenght: 9}"))
    found = checks.recipe_problems(loaded, registry_mod.loaded())
    assert [p.path for p in found] == ["generate.extra.video_lenght"]


def test_input_videos_go_under_the_pipelines_own_names(write, tmp_path):
    """A folder of frames or a video file becomes the list of PIL images diffusers' video
    pipelines take; a mask may be one image."""
    import numpy as np
    from PIL import Image

    from porter.rundir.video import write_mp4

    (tmp_path / "clip").mkdir()
    for i in range(3):
        Image.new("RGB", (16, 16), (i, 0, 0)).save(tmp_path / "clip" / f"{i:05d}.png")
    write_mp4(tmp_path / "control.mp4", np.zeros((4, 16, 16, 3), np.uint8), fps=8)
    Image.new("RGB", (16, 16), (255, 255, 255)).save(tmp_path / "mask.png")
    loaded = load(write, ", video: clip, mask: mask.png, control_video: control.mp4")
    kwargs = call_args.kwargs(loaded, pipeline("CogVideoXFunControlPipeline"))
    assert len(kwargs["control_video"]) == 4 and kwargs["control_video"][0].size == (16, 16)
    kwargs = call_args.kwargs(loaded, pipeline("WanVACEPipeline"))
    assert [frame.getpixel((0, 0)) for frame in kwargs["video"]] == [(0, 0, 0), (1, 0, 0),
                                                                     (2, 0, 0)]
    assert isinstance(kwargs["mask"], Image.Image)
    kwargs = call_args.kwargs(loaded, pipeline("EasyAnimateInpaintPipeline"))
    assert kwargs["mask_video"].shape == (1, 1, 3, 16, 16)  # one image masks every frame
    kwargs = call_args.kwargs(loaded, pipeline("AnimateDiffControlNetPipeline"))
    assert len(kwargs["conditioning_frames"]) == 4


def test_prompt_and_frames_are_passed_only_when_set(write):
    no_prompt = "model: {family: generic, source: tiny}\ngenerate: {height: 32, width: 32, " \
        "steps: 2%s}\n"
    loaded = recipe.load(write("r.yaml", no_prompt % ", image: a.png"))
    assert call_args.problems(loaded, pipeline("StableVideoDiffusionPipeline")) == []
    assert {"prompt", "frames"} & set(call_args.wanted(loaded)) == set()
    loaded = recipe.load(write("r.yaml", no_prompt % ""))
    found = call_args.problems(loaded, pipeline("SkyReelsV2DiffusionForcingPipeline"))
    assert [(p.path, p.hint) for p in found] == [("generate.prompt", "set generate.prompt")]


def test_a_setting_the_pipeline_needs_is_asked_for(write):
    found = call_args.problems(load(write), pipeline("WanVideoToVideoPipeline"))
    # no frame count: the input video's length decides
    assert [p.path for p in found] == ["generate.frames"]
    found = call_args.problems(load(write, "", "generate.frames=null"),
                               pipeline("LucyEditPipeline"))
    assert [(p.path, p.message) for p in found] == [("generate.video",
                                                     "LucyEditPipeline needs video")]
    found = call_args.problems(load(write, "", "generate.frames=null"),
                               pipeline("Cosmos2_5_TransferPipeline"))
    assert [(p.path, p.hint) for p in found] == [("generate.extra",
                                                  "set generate.extra.controls")]
    decoder = "model: {family: generic, source: tiny}\ngenerate: {seed: 1}\n"
    found = call_args.problems(recipe.load(write("d.yaml", decoder)),
                               pipeline("LTX2VideoDiffusionDecodePipeline"))
    assert [(p.path, p.hint) for p in found] == [("generate.latents", "set generate.latents")]


NO_STEPS = "model: {family: generic, source: tiny}\ngenerate: {%s}\n"


def test_steps_are_passed_only_when_set(write):
    """A pipeline that does not denoise (a latent upsampler) or counts its steps per stage
    (Helios's pyramid) takes no num_inference_steps: a recipe for it sets none."""
    loaded = recipe.load(write("r.yaml", NO_STEPS % "video: v, height: 16, width: 16"))
    assert call_args.problems(loaded, pipeline("LTXLatentUpsamplePipeline")) == []
    assert "num_inference_steps" not in call_args.kwargs(loaded, pipeline("LTXPipeline"))
    loaded = recipe.load(write("r.yaml", NO_STEPS % "video: v, steps: 2"))
    found = call_args.problems(loaded, pipeline("LTXLatentUpsamplePipeline"))
    assert [p.path for p in found] == ["generate.steps"]
    assert found[0].message == "LTXLatentUpsamplePipeline takes no num_inference_steps argument"


def test_latents_are_read_from_a_runs_file(write, tmp_path):
    import torch
    from safetensors.torch import save_file

    latents = torch.randn(1, 4, 2, 4, 4)
    save_file({"latents": latents}, tmp_path / "latents.safetensors")
    loaded = recipe.load(write("r.yaml", NO_STEPS % f"latents: {tmp_path}/latents.safetensors"))
    kwargs = call_args.kwargs(loaded, pipeline("LTX2LatentUpsamplePipeline"))
    assert torch.equal(kwargs["latents"], latents)
    save_file({"other": latents}, tmp_path / "latents.safetensors")
    from porter import registry as registry_mod
    from porter.errors import UsageError
    with pytest.raises(UsageError, match="holds no tensor named latents"):
        call_args.kwargs(loaded, pipeline("LTX2LatentUpsamplePipeline"))
    # validate says so first, from the file's header
    [problem] = registry_mod.loaded().family("generic").input_problems(loaded)
    assert problem.path == "generate.latents" and "(it holds other)" in problem.message


CONDITIONED = "model: {family: generic, source: tiny}\ngenerate: {prompt: a, conditions: %s}\n"


def test_conditions_become_the_pipelines_condition_objects(write, tmp_path):
    from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition
    from PIL import Image

    Image.new("RGB", (8, 8), (255, 0, 0)).save(tmp_path / "first.png")
    loaded = recipe.load(write("r.yaml", CONDITIONED % f"[{{frames: {tmp_path}/first.png, "
                                                       "index: 4, strength: 0.5}]"))
    assert call_args.problems(loaded, pipeline("LTX2ConditionPipeline")) == []
    [made] = call_args.kwargs(loaded, pipeline("LTX2ConditionPipeline"))["conditions"]
    assert isinstance(made, LTX2VideoCondition)
    assert (made.index, made.strength, made.frames.size) == (4, 0.5, (8, 8))


def test_conditions_are_checked_against_the_condition_class(write):
    loaded = recipe.load(write("r.yaml", CONDITIONED % "[{index: 4, frame: a.png}, "
                                                       "{frames: missing.png}, {frames: 3}]"))
    found = [p.message for p in call_args.problems(loaded, pipeline("LTX2ConditionPipeline"))]
    assert found == ["generate.conditions[0]: LTX2VideoCondition has no field 'frame'",
                     "generate.conditions[0]: LTX2VideoCondition needs frames",
                     "generate.conditions[1].frames: no such file: missing.png",
                     "generate.conditions[2].frames: expected a path"]
    found = call_args.problems(loaded, pipeline("LTXPipeline"))
    assert [p.message for p in found] == ["LTXPipeline takes no conditions argument"]
    # a call of **kwargs: checked all the same, and refused (no class to build)
    found = call_args.problems(loaded, pipeline("DiffusionPipeline"))
    assert [p.message for p in found] == [
        "DiffusionPipeline's conditions argument takes no condition objects Porter can build"]


def test_a_pipeline_that_takes_tensors_only_gets_its_inputs_as_tensors(write, tmp_path):
    """EasyAnimate's inpainting call takes video and mask_video as 5-D tensors only."""
    from PIL import Image

    for name, color in (("video", (255, 0, 0)), ("mask", (255, 255, 255))):
        (tmp_path / name).mkdir()
        for i in range(3):
            Image.new("RGB", (8, 4), color).save(tmp_path / name / f"{i}.png")
    loaded = recipe.load(write("r.yaml", NO_STEPS % f"video: {tmp_path}/video, "
                                                    f"mask: {tmp_path}/mask, steps: 2"))
    kwargs = call_args.kwargs(loaded, pipeline("EasyAnimateInpaintPipeline"))
    assert kwargs["video"].shape == (1, 3, 3, 4, 8) and kwargs["mask_video"].shape == (1, 1, 3, 4, 8)
    assert kwargs["video"][0, :, 0, 0, 0].tolist() == [1.0, 0.0, 0.0]
    assert kwargs["mask_video"].min() == 255.0  # the pipeline's own helper's scale
    # a pipeline that takes images gets images
    assert isinstance(call_args.kwargs(loaded, pipeline("WanVACEPipeline"))["video"], list)


def test_a_schedule_goes_to_a_pipeline_that_takes_it_and_is_refused_where_none_does(write):
    """A generic pipeline runs its own loop: a schedule given step by step reaches its
    scheduler only through a call argument of that name."""
    loaded = recipe.load(write("s.yaml", "model: {family: generic, source: tiny}\n"
                               "generate: {prompt: a cat, sigmas: [1.0, 0.5]}\n"))
    assert loaded.generate.steps == 2
    kwargs = call_args.kwargs(loaded, pipeline("HunyuanVideoPipeline"))
    assert kwargs["sigmas"] == [1.0, 0.5] and "num_inference_steps" not in kwargs
    [problem] = call_args.problems(loaded, pipeline("WanPipeline"))
    assert problem.path == "generate.sigmas" and "takes no sigmas argument" in problem.message
    assert "staged family" in problem.hint
