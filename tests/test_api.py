"""Porter as a library: porter.load -> Port; generate many times on one compile."""

import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest
import torch

import porter
from porter.errors import RecipeError

from support import ROOT, TINY_RECIPE
from support.references import diffusers_latents

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    path = tmp_path_factory.mktemp("api") / "tiny.yaml"
    path.write_text(TINY_RECIPE)
    with porter.load(path, "generate.guidance_scale=4.0") as loaded:
        yield loaded


def test_generate_matches_diffusers_and_compiles_once(port):
    first = port.generate(prompt="a dog", seed=3)
    again = port.generate(prompt="a dog", seed=3)
    other = port.generate(prompt="a dog", seed=4)
    reference = diffusers_latents(port.settings(prompt="a dog", seed=3))
    assert first.frames.dtype == np.uint8 and first.frames.shape == (9, 32, 32, 3)
    assert (first.latents - reference).abs().max() < 1e-4
    assert torch.equal(first.latents, again.latents)
    assert not torch.equal(first.latents, other.latents)
    # the later calls have the first one's shapes: nothing compiles, and the record says so
    for later in (again, other):
        compiled = later.record["timings"]["compile"]
        assert compiled["seconds"] == 0 and compiled["programs"] == 0
    assert again.record["seed"] == 3 and again.record["recipe"]["generate"]["prompt"] == "a dog"


def test_new_shapes_compile_and_bad_settings_are_recipe_errors(port):
    longer = port.generate(frames=13)
    assert longer.frames.shape[0] == 13
    assert longer.record["timings"]["compile"]["seconds"] > 0
    with pytest.raises(RecipeError, match="4n\\+1"):
        port.generate(frames=10)
    with pytest.raises(RecipeError, match="did you mean 'frames'"):
        port.generate(framez=9)
    with pytest.raises(RecipeError, match="Port.generate: generate.steps"):
        port.generate(steps=0)
    with pytest.raises(RecipeError, match="this text-to-video model takes no image"):
        port.generate(image=ROOT / "recipes" / "assets" / "last_frame.png")


def test_settings_that_need_another_pipeline_are_refused():
    """TI2V-5B takes text or an image, through two pipelines: a port loaded for one
    cannot run the other (checked without loading anything)."""
    from porter import registry as registry_mod, recipe
    from porter.port.checks import with_settings as checked_settings

    registry = registry_mod.loaded()
    text_mode = recipe.load(ROOT / "recipes" / "wan22-ti2v-tiny.yaml", ["generate.image=null"])
    with pytest.raises(RecipeError, match="needs WanImageToVideoPipeline, but this port "
                       "loaded WanPipeline"):
        checked_settings(text_mode, registry, {"image": ROOT / "recipes" / "assets" /
                                               "first_frame.png"})
    image_mode = recipe.load(ROOT / "recipes" / "wan22-ti2v-tiny.yaml")
    with pytest.raises(RecipeError, match="needs WanPipeline"):
        checked_settings(image_mode, registry, {"image": None})
    assert checked_settings(image_mode, registry, {"seed": 5}).generate.seed == 5


def test_save_writes_video_record_lossless_frames_and_latents(port, tmp_path):
    result = port.generate(prompt="a fox")
    npy = result.save(tmp_path / "npy")
    data = json.loads(npy.read_text())
    assert data["outputs"]["video"] == "video.mp4"
    assert (tmp_path / "npy" / "video.mp4").stat().st_size > 0
    recipe = port.recipe  # its output section decides what is written
    for frames in ("npy", "png"):
        result.recipe = recipe.model_copy(update={"output": recipe.output.model_copy(
            update={"frames": frames, "latents": True, "video": False})})
        folder = tmp_path / frames
        data = json.loads(result.save(folder).read_text())
        outputs = data["outputs"]
        assert outputs["video"] is None and not (folder / "video.mp4").exists()
        assert outputs["latents"] == "latents.safetensors"
        from safetensors.torch import load_file
        assert torch.equal(load_file(folder / "latents.safetensors")["latents"],
                           result.latents)
        if frames == "npy":
            assert np.array_equal(np.load(folder / "frames.npy"), result.frames)
        else:
            from PIL import Image
            pngs = sorted((folder / "frames").glob("*.png"))
            assert len(pngs) == 9 and outputs["lossless_frames"] == "frames/"
            assert np.array_equal(np.asarray(Image.open(pngs[4])), result.frames[4])
        for name, digest in outputs["files"].items():
            import hashlib
            assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
    # saved again without png frames: the older frames go with the older record
    result.recipe = recipe
    result.save(tmp_path / "png")
    assert not (tmp_path / "png" / "frames").exists()
    assert (tmp_path / "png" / "video.mp4").exists()


def test_transformer_as_a_torch_teacher(port):
    """The ported transformer called on CPU torch tensors (inside a training loop, say)
    answers as the PyTorch transformer does."""
    from porter import loading

    reference = loading.load_pipeline(port.family, port.recipe).transformer
    teacher = port.as_torch("transformer")
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, 16, 3, 4, 4, generator=generator)  # (batch, channels, frames, h, w)
    text = torch.randn(1, 16, 32, generator=generator)
    t = torch.tensor([500.0])
    with torch.no_grad():
        want = reference(hidden_states=x, timestep=t, encoder_hidden_states=text,
                         return_dict=False)[0]
    got = teacher(hidden_states=x, timestep=t, encoder_hidden_states=text,
                  return_dict=False)[0]
    assert isinstance(got, torch.Tensor) and got.device.type == "cpu"
    assert (got - want).abs().max() < 1e-4


def test_a_component_it_lacks_and_a_closed_port_are_said(port, tmp_path):
    from porter.errors import UsageError
    from porter.generate.call import Call

    with pytest.raises(UsageError) as refused:
        port.as_torch("nope")
    assert refused.value.message == "no component 'nope' in this port"
    assert "transformer" in refused.value.hint and "vae" in refused.value.hint
    # a folder given as text, as the docs write it
    assert Call(port.recipe, directory=str(tmp_path)).directory == tmp_path
    closed = porter.load(port.recipe)
    closed.close()
    with pytest.raises(UsageError, match="this port is closed"):
        closed.generate()
    with pytest.raises(UsageError, match="this port is closed"):
        closed.transformer


def test_written_files_follow_the_umask(tmp_path):
    """Every file a run writes (stages, record, video, lossless frames, latents) gets
    the user's umask, as the files of any other program do."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY_RECIPE)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", "import os, sys; os.umask(0o027); from porter.cli import "
         "main; sys.exit(main(sys.argv[1:]))", "run", str(recipe), f"output.dir={out}",
         "output.frames=png", "output.latents=true", "output.video=false", "--no-progress"],
        capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote frames/, latents.safetensors, run.json to {out}")
    assert not (out / "video.mp4").exists()
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) > 9
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o640, path
    assert stat.S_IMODE((out / "frames").stat().st_mode) == 0o750


def test_the_teacher_example_runs_as_documented():
    """examples/teacher.py (docs/python-api.md): a student learns from the ported
    transformer inside a PyTorch loop, in a fresh process."""
    done = subprocess.run([sys.executable, "examples/teacher.py", "recipes/wan-tiny.yaml",
                           "--steps", "10"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    losses = [float(line.rsplit(" ", 1)[1]) for line in done.stdout.splitlines()
              if line.startswith("step ")]
    assert len(losses) == 3 and losses[-1] < losses[0]


def test_importing_porter_and_its_registry_imports_neither_torch_nor_jax():
    """``porter.hookimpl`` is what a plugin imports: the facade and the registry it comes
    from stay light (a fresh process: this one has imported both)."""
    probe = ("import sys, porter, porter.registry; "
             "print(sorted({'torch', 'jax'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_load_says_what_it_takes_before_loading_anything(write):
    """A list of overrides (as argparse holds them) or something that is no recipe:
    a usage error naming the form, not an AttributeError from deep inside."""
    from porter.errors import UsageError

    path = write("r.yaml", TINY_RECIPE)
    with pytest.raises(UsageError, match="overrides are strings KEY=VALUE") as refused:
        porter.load(path, ["generate.steps=2"])
    assert "porter.load(recipe, *overrides)" in refused.value.hint
    with pytest.raises(UsageError, match="a recipe file's path or a loaded Recipe, not int"):
        porter.load(42)


def test_settings_from_numpy_are_the_numbers_they_are(write):
    """A seed from np.arange is an integer (its .item()); a float height stays refused,
    as in a recipe (no silent 64.0 -> 64)."""
    from porter import recipe, registry
    from porter.port import checks

    loaded = recipe.load(write("r.yaml", TINY_RECIPE))
    changed = checks.with_settings(loaded, registry.loaded(), {"seed": np.int64(3),
                                                               "guidance_scale": np.float32(2)})
    assert changed.generate.seed == 3 and type(changed.generate.seed) is int
    assert changed.generate.guidance_scale == 2.0
    with pytest.raises(RecipeError, match="generate.height"):
        checks.with_settings(loaded, registry.loaded(), {"height": 64.0})
