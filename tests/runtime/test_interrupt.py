"""Interrupted runs: progress saved at step boundaries, nothing half-written looks
complete, and --resume gives the latents of an uninterrupted run, bit for bit.

The model is a tiny Wan saved to disk with a multistep scheduler (UniPC, as
the released Wan checkpoints ship), so resuming must restore the scheduler's
history of model outputs, not just the latents.
"""

import os
import signal
import subprocess
import sys

import pytest
import torch

from porter import registry as registry_mod, recipe
from porter.commands.run import run
from porter.errors import Interrupted
from porter.rundir import artifacts

from support.processes import interrupt_at_step, slow_porter, terminate_after

pytestmark = pytest.mark.slow

STEPS = 6

RECIPE = """\
model: {{family: wan, source: {source}}}
generate: {{prompt: "a cat", height: 32, width: 32, frames: 9, steps: %d,
           max_sequence_length: 16}}
output: {{dir: {out}, checkpoint_every: 2}}
""" % STEPS

SLOW_PORTER = slow_porter("UniPCMultistepScheduler")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Wan pipeline with Wan's UniPC scheduler, saved with save_pretrained."""
    from diffusers import UniPCMultistepScheduler

    from porter_wan.tiny import build_pipeline

    pipe = build_pipeline()
    pipe.scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction",
                                             use_flow_sigmas=True, flow_shift=3.0)
    directory = tmp_path_factory.mktemp("unipc-wan")
    pipe.save_pretrained(directory)
    return directory


def recipe_file(directory, checkpoint, out):
    path = directory / "r.yaml"
    path.write_text(RECIPE.format(source=checkpoint, out=out))
    return path


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, checkpoint):
    directory = tmp_path_factory.mktemp("whole")
    loaded = recipe.load(recipe_file(directory, checkpoint, directory / "out"))
    return run(loaded, registry_mod.loaded(), progress=False)


def progress_files(directory):
    return sorted(p.name for p in directory.glob("progress-*"))


def test_periodic_checkpoints_are_dropped_when_denoising_completes(uninterrupted):
    assert progress_files(uninterrupted.directory) == []
    assert artifacts.complete(uninterrupted.directory, "denoise")


def test_signal_mid_step_saves_that_step_and_resume_matches(checkpoint, uninterrupted,
                                                            tmp_path, monkeypatch):
    """SIGINT during step 3 (of 6): the step finishes, is saved, the run stops."""
    from diffusers import UniPCMultistepScheduler

    loaded = recipe.load(recipe_file(tmp_path, checkpoint, tmp_path / "out"),
                         ["output.checkpoint_every=0"])  # only the interrupt saves
    interrupt_at_step(monkeypatch, UniPCMultistepScheduler, 3)
    with pytest.raises(Interrupted) as info:
        run(loaded, registry_mod.loaded(), progress=False)
    assert info.value.exit_code == 130 and info.value.saved == f"3 of {STEPS} denoising steps"
    out = tmp_path / "out"
    assert progress_files(out) == ["progress-000003.json", "progress-000003.safetensors"]
    assert not artifacts.complete(out, "denoise") and not (out / "video.mp4").exists()

    monkeypatch.undo()
    resumed = run(loaded, registry_mod.loaded(), progress=False, resume=True)
    assert resumed.data["timings"]["resumed_from_step"] == 3
    assert len(resumed.data["timings"]["steps_s"]) == STEPS - 3
    assert torch.equal(resumed.latents, uninterrupted.latents)
    assert progress_files(out) == []


def test_killed_process_resumes_to_the_same_latents(checkpoint, uninterrupted, tmp_path):
    """SIGTERM to a real `porter run` after its first periodic checkpoint."""
    out = tmp_path / "out"
    path = recipe_file(tmp_path, checkpoint, out)
    child = subprocess.Popen([sys.executable, "-c", SLOW_PORTER, "run", str(path)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    stderr = terminate_after(child, out / "progress-000002.json", 240)
    assert child.returncode == 128 + signal.SIGTERM, stderr
    assert "interrupted by SIGTERM" in stderr and "--resume" in stderr
    assert "Traceback" not in stderr
    saved = [name for name in progress_files(out) if name.endswith(".json")]
    assert saved in (["progress-000002.json"], ["progress-000003.json"]), saved
    assert not artifacts.complete(out, "denoise") and not (out / "run.json").exists()
    assert not list(out.glob("*.partial")) and not list(out.glob(".*.partial"))

    resumed = run(recipe.load(path), registry_mod.loaded(), progress=False, resume=True)
    assert resumed.data["timings"]["resumed_from_step"] in (2, 3)
    assert torch.equal(resumed.latents, uninterrupted.latents)
    assert (resumed.frames == uninterrupted.frames).all()


def test_progress_from_other_settings_is_refused(checkpoint, uninterrupted, tmp_path,
                                                 monkeypatch):
    from diffusers import UniPCMultistepScheduler

    path = recipe_file(tmp_path, checkpoint, tmp_path / "out")
    interrupt_at_step(monkeypatch, UniPCMultistepScheduler, 2)
    with pytest.raises(Interrupted):
        run(recipe.load(path), registry_mod.loaded(), progress=False)
    monkeypatch.undo()
    from porter.errors import UsageError
    with pytest.raises(UsageError, match="generate.seed: artifact 0, recipe 5"):
        run(recipe.load(path, ["generate.seed=5"]), registry_mod.loaded(), progress=False,
            resume=True)
