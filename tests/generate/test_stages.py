"""Staged runs: each stage saved atomically, resumable, refused when settings differ."""

import pytest
import torch

from porter import registry as registry_mod, recipe
from porter.commands.run import run
from porter.errors import UsageError
from porter.generate.runners import STAGED
from porter.rundir import artifacts

from support import TINY_RECIPE

pytestmark = pytest.mark.slow


def load(write, directory, *overrides):
    path = write("r.yaml", TINY_RECIPE)
    return recipe.load(path, [f"output.dir={directory}", "generate.steps=2", *overrides])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    directory = tmp_path_factory.mktemp("whole")
    (directory / "r.yaml").write_text(TINY_RECIPE)
    loaded = recipe.load(directory / "r.yaml", [f"output.dir={directory}", "generate.steps=2"])
    return run(loaded, registry_mod.loaded(), progress=False)


def test_stage_by_stage_equals_uninterrupted(uninterrupted, write, tmp_path):
    loaded = load(write, tmp_path / "staged")
    for stage in artifacts.STAGES:
        result = run(loaded, registry_mod.loaded(), progress=False, stage=stage)
    assert torch.equal(result.latents, uninterrupted.latents)
    assert (result.frames == uninterrupted.frames).all()
    assert sorted(p.name for p in (tmp_path / "staged").iterdir()) == [
        ".porter.lock", "denoise.json", "denoise.safetensors", "encode.json", "encode.safetensors",
        "run.json", "stream.mp4", "video.mp4"]


def test_resume_after_encode(uninterrupted, write, tmp_path):
    loaded = load(write, tmp_path / "resumed")
    run(loaded, registry_mod.loaded(), progress=False, stage="encode")
    assert STAGED.stages_to_run(tmp_path / "resumed", None, True) == ("denoise", "decode")
    result = run(loaded, registry_mod.loaded(), progress=False, resume=True)
    assert result.data["timings"]["stages"] == ["denoise", "decode"]
    assert torch.equal(result.latents, uninterrupted.latents)


def test_artifact_from_other_settings_is_refused(uninterrupted, write):
    other = load(write, uninterrupted.directory, "generate.seed=7")
    with pytest.raises(UsageError) as info:
        run(other, registry_mod.loaded(), progress=False, stage="decode")
    assert "generate.seed: artifact 0, recipe 7" in info.value.message


def test_missing_previous_stage(write, tmp_path):
    with pytest.raises(UsageError, match="no complete encode stage") as info:
        run(load(write, tmp_path / "empty"), registry_mod.loaded(), progress=False,
            stage="denoise")
    assert "--stage encode" in info.value.hint


def test_decode_into_an_empty_folder_names_every_stage_it_needs_first(write, tmp_path):
    with pytest.raises(UsageError, match="no complete denoise stage") as info:
        run(load(write, tmp_path / "empty"), registry_mod.loaded(), progress=False,
            stage="decode")
    assert "`porter run RECIPE --stage encode`, then `porter run RECIPE --stage denoise` " \
        "first" in info.value.hint
    assert not (tmp_path / "empty").exists()  # refused before a folder was made for it


def test_half_written_stage_is_not_complete(uninterrupted, tmp_path):
    """Only the JSON, written last by an atomic rename, marks a stage complete."""
    directory = tmp_path / "half"
    directory.mkdir()
    for name in ("encode.json", "encode.safetensors"):
        (directory / name).write_bytes((uninterrupted.directory / name).read_bytes())
    (directory / "denoise.safetensors.partial").write_bytes(b"\0" * 100)
    (directory / "denoise.safetensors").write_bytes(b"\0" * 100)  # no denoise.json
    assert STAGED.stages_to_run(directory, None, True) == ("denoise", "decode")


def test_corrupt_artifact_is_a_clear_error(uninterrupted, write, tmp_path):
    directory = tmp_path / "corrupt"
    directory.mkdir()
    for name in ("denoise.json", "denoise.safetensors"):
        (directory / name).write_bytes((uninterrupted.directory / name).read_bytes())
    data = (directory / "denoise.safetensors").read_bytes()
    (directory / "denoise.safetensors").write_bytes(data[: len(data) // 2])  # truncated
    loaded = load(write, directory)
    with pytest.raises(UsageError, match="cannot be read"):
        artifacts.load(directory, "denoise", loaded)


def test_a_stage_made_from_other_checkpoint_files_is_refused(write, tmp_path):
    """A local checkpoint re-saved (here the transformer in another dtype) after a stage
    was made from it: the stage is refused before any weight is loaded, naming the
    file; the same files give the latents of one uninterrupted run."""
    from safetensors.torch import load_file, save_file

    from porter_wan.tiny import build_pipeline

    source = tmp_path / "checkpoint"
    build_pipeline().save_pretrained(source)
    path = write("r.yaml", TINY_RECIPE.replace("source: tiny", f"source: {source}"))
    loaded = recipe.load(path, [f"output.dir={tmp_path / 'out'}", "generate.steps=2"])
    run(loaded, registry_mod.loaded(), progress=False, stage="encode")
    weights = source / "transformer" / "diffusion_pytorch_model.safetensors"
    original = weights.read_bytes()
    state = load_file(weights)
    save_file({name: tensor.half() for name, tensor in state.items()}, weights,
              metadata={"format": "pt"})
    with pytest.raises(UsageError) as info:
        run(loaded, registry_mod.loaded(), progress=False, resume=True)
    assert "encode.safetensors was made from other checkpoint files: " \
           "transformer/diffusion_pytorch_model.safetensors has changed" in info.value.message
    assert "restore the file" in info.value.hint

    weights.write_bytes(original)
    resumed = run(loaded, registry_mod.loaded(), progress=False, resume=True)
    assert resumed.data["timings"]["stages"] == ["denoise", "decode"]
    whole = run(recipe.load(path, [f"output.dir={tmp_path / 'whole'}", "generate.steps=2"]),
                registry_mod.loaded(), progress=False)
    assert torch.equal(resumed.latents, whole.latents)
