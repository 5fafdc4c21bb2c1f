"""A finished run's files: the record names each by its hash, stage files changed in place
or holding NaN are refused, and a new run never pairs with an older record."""

import shutil

import pytest

from porter import registry as registry_mod
from porter.commands.run import run
from porter.errors import UsageError
from porter.rundir import artifacts
from porter.runtime import atomic

from support.runs import tiny_recipe

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One complete tiny run, to copy and damage."""
    directory = tmp_path_factory.mktemp("finished")
    return run(tiny_recipe(directory, directory / "out"), registry_mod.loaded(), progress=False)


def copy_run(finished, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(finished.directory, out)
    return out


def test_a_new_run_never_pairs_with_an_older_record(finished, tmp_path, monkeypatch):
    """A run killed between writing its video and its record leaves its video alone:
    the older run's record was removed before the new run wrote anything."""
    out = copy_run(finished, tmp_path)
    from porter.rundir import record

    def killed(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(record, "write_json", killed)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_recipe(tmp_path, out, "tiny", "generate.seed=1"), registry_mod.loaded(),
            progress=False)
    assert (out / "video.mp4").exists() and not (out / "run.json").exists()
    assert atomic.sha256(out / "video.mp4") != finished.data["outputs"]["files"]["video.mp4"]


def test_the_record_names_each_file_with_its_hash(finished):
    files = finished.data["outputs"]["files"]
    assert set(files) == {"video.mp4", "stream.mp4", "encode.safetensors",
                          "denoise.safetensors"}
    for name, digest in files.items():
        assert atomic.sha256(finished.directory / name) == digest


def _flip_a_data_byte(path):
    """Change one value in place: same header, same size, same shape and dtype."""
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("stage, changed", [("decode", "denoise"), ("denoise", "encode")])
def test_stage_files_changed_in_place_are_refused(finished, tmp_path, stage, changed):
    out = copy_run(finished, tmp_path)
    _flip_a_data_byte(out / f"{changed}.safetensors")
    with pytest.raises(UsageError, match=f"{changed}.safetensors has changed since its "
                                         "record was written") as info:
        run(tiny_recipe(tmp_path, out), registry_mod.loaded(), progress=False, stage=stage)
    assert "delete the stage's files" in info.value.hint


def test_nan_latents_in_a_stage_file_are_refused(finished, tmp_path):
    out = copy_run(finished, tmp_path)
    loaded = tiny_recipe(tmp_path, out)
    latents = finished.latents.clone()
    latents.view(-1)[:3] = float("nan")
    artifacts.save(out, "denoise", {"latents": latents}, loaded)  # a record that agrees
    with pytest.raises(UsageError, match="tensor 'latents' holds 3 NaN or infinite"):
        run(loaded, registry_mod.loaded(), progress=False, stage="decode")
