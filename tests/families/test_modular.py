"""Modular diffusers pipelines (blocks assembled at run time) as a source like any
other: named in model.pipeline over a classic checkpoint, or found in a modular
checkpoint's own index; checked against the inputs their blocks declare before any
weight is read; loaded by diffusers' own modular machinery, with the weights Porter
reads straight into their shards handed over empty. The runs themselves are compared
with diffusers in the matrix (tests/matrix/modular.py)."""

import pytest
import torch

from porter import loading, registry as registry_mod, recipe
from porter.commands.validate import validate
from porter.families import generic
from porter.loading import modular as modular_checkpoint
from porter.recipe import modular

from models.wan_t2v import build_wan_t2v_pipeline

RECIPE = """\
model: {{family: generic, source: {source}{pipeline}}}
generate: {{prompt: "a cat", height: 16, width: 16, frames: 9, steps: 2,
           guidance_scale: 6.0, max_sequence_length: 16{extra}}}
"""


@pytest.fixture(scope="module")
def classic(tmp_path_factory):
    """A classic tiny Wan checkpoint (model_index.json)."""
    path = tmp_path_factory.mktemp("wan") / "ckpt"
    build_wan_t2v_pipeline().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def saved_modular(classic, tmp_path_factory):
    """The same weights saved by diffusers as a modular checkpoint
    (modular_model_index.json, no model_index.json)."""
    import diffusers

    path = tmp_path_factory.mktemp("wan-modular") / "ckpt"
    pipe = diffusers.WanModularPipeline(pretrained_model_name_or_path=str(classic))
    pipe.load_components(torch_dtype=torch.float32)
    pipe.save_pretrained(str(path), overwrite_modular_index=True)
    return path


def load(write, source, pipeline="WanModularPipeline", extra=""):
    named = f", pipeline: {pipeline}" if pipeline else ""
    return recipe.load(write("r.yaml", RECIPE.format(source=source, pipeline=named,
                                                     extra=extra)))


def test_a_modular_class_over_a_classic_checkpoint_validates(classic, write):
    assert validate(load(write, classic), registry_mod.loaded()) == []


def test_a_modular_checkpoint_names_its_own_class(saved_modular, write):
    loaded = load(write, saved_modular, pipeline=None)
    assert validate(loaded, registry_mod.loaded()) == []
    family = registry_mod.loaded().family("generic")
    assert family.pipeline_class(loaded).__name__ == "WanModularPipeline"
    assert set(modular_checkpoint.index_entries(saved_modular)) == {
        "text_encoder", "tokenizer", "transformer", "vae", "scheduler"}


def test_the_blocks_inputs_are_checked_every_problem_at_once(classic, write):
    loaded = load(write, classic, extra=", extra: {num_frame: 3, flow_shif: 2.0}")
    found = {p.path: p for p in validate(loaded, registry_mod.loaded())}
    assert "takes no argument 'num_frame'" in found["generate.extra.num_frame"].message
    assert "num_frames" in found["generate.extra.num_frame"].hint
    assert found["generate.extra.num_frame"].line == 3  # where it is in the file
    assert "flow_shif" in found["generate.extra.flow_shif"].message
    taken = found["generate.extra.flow_shif"].hint  # no close name: what it takes
    assert taken.startswith("it takes: ") and "num_inference_steps" in taken


@pytest.mark.parametrize("name,reason", [
    ("FluxModularPipeline", "makes images, not video"),
    ("ModularPipeline", "assembles no blocks of its own"),
])
def test_modular_classes_that_make_no_video_are_refused(classic, write, name, reason):
    found = validate(load(write, classic, pipeline=name), registry_mod.loaded())
    assert any(reason in p.message for p in found), [p.message for p in found]


def test_components_are_read_into_their_shards_not_loaded(saved_modular, write):
    """The weights of a modular checkpoint's components are located, not loaded: the
    modules are handed to diffusers' pipeline empty, as a classic checkpoint's are."""
    loaded = load(write, saved_modular, pipeline=None)
    made = loading.load_for_port(registry_mod.loaded().family("generic"), loaded)
    assert type(made.pipe).__name__ == "WanModularPipeline"
    assert set(made.weights) == {"text_encoder", "transformer", "vae"}
    assert made.pipe.transformer.proj_out.weight.device.type == "meta"
    assert made.pipe.tokenizer is not None and made.pipe.scheduler is not None


def test_a_component_diffusers_cannot_load_is_an_error(classic, tmp_path):
    import shutil

    broken = tmp_path / "ckpt"
    shutil.copytree(classic, broken)
    shutil.rmtree(broken / "scheduler")
    import diffusers
    with pytest.raises(OSError, match="diffusers could not load scheduler"):
        modular_checkpoint.load(diffusers.WanModularPipeline, broken, torch.float32, {})


def test_guidance_is_set_on_the_guider_for_one_call(classic):
    import diffusers

    pipe = modular_checkpoint.load(diffusers.WanModularPipeline, classic, torch.float32, {})
    before = pipe.guider
    with generic._guided(pipe, {"guider": 2.5}):
        assert pipe.guider.guidance_scale == 2.5
    assert pipe.guider is before and before.guidance_scale == 5.0
    with pytest.raises(KeyError), generic._guided(pipe, {"guider": 2.5}):
        raise KeyError("a call that fails")
    assert pipe.guider is before  # put back however the call ends
    params = modular.parameters(diffusers.Wan22ModularPipeline)
    assert {"guidance_scale", "guidance_scale_2", "num_frames"} <= set(params)
    assert modular.guided(diffusers.LTX2ModularPipeline) == {
        "guidance_scale": "guider", "audio_guidance_scale": "audio_guider"}


def test_verify_and_bench_say_why_they_cannot(classic, write):
    """They call the transformer by themselves, on inputs a family describes: the
    generic family describes none (its pipeline's own call makes them). Refused before
    anything loads."""
    from porter.commands.bench import bench
    from porter.commands.verify import verify
    from porter.errors import UsageError

    loaded = load(write, classic)
    for command in (verify, bench):
        with pytest.raises(UsageError, match="describes none"):
            command(loaded, registry_mod.loaded())


@pytest.mark.slow
def test_a_lora_on_a_modular_pipeline_matches_diffusers(classic, write, tmp_path):
    """WanModularPipeline loads LoRA as WanPipeline does (its mixin): fused by Porter,
    the frames equal diffusers' own load_lora_weights + fuse_lora on the modular
    pipeline, and differ from those without it."""
    import json

    import diffusers
    import numpy as np

    from porter.commands.run import run

    from support.lora import make_lora

    file = make_lora(tmp_path)
    loaded = recipe.load(write("r.yaml", RECIPE.format(
        source=classic, pipeline=", pipeline: WanModularPipeline", extra="") +
        f"lora: {json.dumps([{'file': str(file), 'scale': 0.7}])}\n"),
        [f"output.dir={tmp_path / 'out'}", "output.latents=true"])
    assert validate(loaded, registry_mod.loaded()) == []
    result = run(loaded, registry_mod.loaded(), progress=False)
    ours = result.frames
    # its state's final latents: checked when the call ends, written on request
    assert result.data["outputs"]["latents"] == "latents.safetensors"
    assert tuple(result.latents.shape) == (1, 16, 3, 2, 2)

    def theirs(lora: bool):
        pipe = modular_checkpoint.load(diffusers.WanModularPipeline, classic,
                                       torch.float32, {})
        if lora:
            pipe.load_lora_weights(str(file))
            pipe.fuse_lora(lora_scale=0.7)
        pipe.update_components(guider=pipe.guider.new(guidance_scale=6.0))
        video = pipe(prompt="a cat", height=16, width=16, num_frames=9,
                     num_inference_steps=2, max_sequence_length=16, output_type="np",
                     generator=torch.Generator().manual_seed(0), output="videos")[0]
        return (np.asarray(video) * 255).round().clip(0, 255).astype("uint8")

    expected = theirs(lora=True)
    assert np.abs(ours.astype(int) - expected.astype(int)).max() <= 1
    assert np.abs(theirs(lora=False).astype(int) - expected.astype(int)).max() > 1
