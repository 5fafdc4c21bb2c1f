"""CogVideoX runs in Porter's stages: a killed run resumes to the uninterrupted run's
latents bit for bit, stage by stage equals whole, and plain diffusers agrees.

The tiny CogVideoX 1.5 (latent frames padded to the temporal patch) is saved to disk
with CogVideoX's DPM-Solver, which draws fresh noise from the run's generator at every
step and carries its previous clean-sample prediction: resuming must restore both.
"""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from porter import registry as registry_mod, recipe
from porter.commands.run import run

from support.processes import slow_porter, terminate_after

pytestmark = pytest.mark.slow

STEPS = 6

RECIPE = """\
model: {{family: cogvideox, source: {source}}}
mesh: {{dp: 2}}
generate: {{prompt: "a red fox in the snow", negative_prompt: "blurry", height: 16,
           width: 16, frames: 9, steps: %d, guidance_scale: 6.0, max_sequence_length: 16,
           cfg_parallel: true, seed: 7}}
rotary: {{precompute: true}}
output: {{dir: {out}, checkpoint_every: 3}}
""" % STEPS


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from diffusers import CogVideoXDPMScheduler

    from porter_cogvideox.tiny import build_pipeline

    pipe = build_pipeline("1.5")
    pipe.scheduler = CogVideoXDPMScheduler.from_config(pipe.scheduler.config)
    directory = tmp_path_factory.mktemp("cogvideox-dpm")
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


def test_matches_plain_diffusers(checkpoint, uninterrupted):
    from diffusers import CogVideoXPipeline

    pipe = CogVideoXPipeline.from_pretrained(checkpoint)
    gen = recipe.load(recipe_file(checkpoint, checkpoint, "unused")).generate

    def plain(output_type):
        return pipe(gen.prompt, negative_prompt=gen.negative_prompt, height=gen.height,
                    width=gen.width, num_frames=gen.frames, num_inference_steps=gen.steps,
                    guidance_scale=gen.guidance_scale, max_sequence_length=16,
                    generator=torch.Generator().manual_seed(gen.seed),
                    output_type=output_type).frames[0]

    expected = plain("np")
    assert uninterrupted.frames.shape == (9, 16, 16, 3)
    assert np.abs((expected * 255).round() - uninterrupted.frames).max() <= 1
    # the latents (padding frame included), which every step's fresh noise moves
    latents = plain("latent")
    assert latents.shape == uninterrupted.latents[0].shape == (4, 4, 2, 2)
    scale = latents.abs().max()
    assert (latents - uninterrupted.latents[0]).abs().max() <= 1e-4 * scale
    assert uninterrupted.data["timings"]["stages"] == ["encode", "denoise", "decode"]


def test_killed_process_resumes_to_the_same_latents(checkpoint, uninterrupted, tmp_path):
    """SIGTERM to a real `porter run` after its checkpoint at step 3 of 6."""
    out = tmp_path / "out"
    path = recipe_file(tmp_path, checkpoint, out)
    child = subprocess.Popen([sys.executable, "-c", slow_porter("CogVideoXDPMScheduler"),
                              "run", str(path)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    stderr = terminate_after(child, out / "progress-000003.json", 300)
    assert child.returncode == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr and "--resume" in stderr
    assert not (out / "run.json").exists()

    resumed = run(recipe.load(path), registry_mod.loaded(), progress=False, resume=True)
    assert resumed.data["timings"]["resumed_from_step"] in (3, 4)
    assert torch.equal(resumed.latents, uninterrupted.latents)
    assert (resumed.frames == uninterrupted.frames).all()


def test_stage_by_stage_equals_uninterrupted(checkpoint, uninterrupted, tmp_path):
    loaded = recipe.load(recipe_file(tmp_path, checkpoint, tmp_path / "out"))
    for stage in ("encode", "denoise", "decode"):
        result = run(loaded, registry_mod.loaded(), progress=False, stage=stage)
    assert torch.equal(result.latents, uninterrupted.latents)
    assert (result.frames == uninterrupted.frames).all()
