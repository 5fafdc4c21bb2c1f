"""NaN and infinity, caught where they enter (weights) and where they matter (the latents
after each step), counted exactly."""

import pytest
import torch

from porter import registry as registry_mod, recipe
from porter.commands.run import run
from porter.rundir import artifacts

from support import RECIPES
from support.processes import porter_process
from support.runs import RECIPE, tiny_recipe

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nan_checkpoint(tmp_path_factory):
    from porter_wan.tiny import build_pipeline

    pipe = build_pipeline()
    with torch.no_grad():
        pipe.transformer.proj_out.weight[0, :5] = float("nan")
        pipe.transformer.proj_out.weight[1, 0] = float("inf")
    directory = tmp_path_factory.mktemp("nan-wan")
    pipe.save_pretrained(directory)
    return directory


def test_nan_weights_are_refused_at_load_naming_the_tensor(nan_checkpoint, tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.format(source=nan_checkpoint, out=tmp_path / "out"))
    done = porter_process("run", str(path), "--no-progress")
    assert done.returncode == 2, done.stderr
    assert "NaN or infinite values in 1 weight tensor(s): transformer.proj_out.weight (6)" \
        in done.stderr
    assert "model.allow_nonfinite" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out" / "video.mp4").exists()


def test_latents_going_nonfinite_stop_the_run_at_that_step(nan_checkpoint, tmp_path,
                                                           capsys):
    """Allowed NaN weights are a warning; the first step then makes NaN latents, and the
    run stops there (exit 2), keeping the encode stage, writing no video."""
    from porter.errors import NonFinite
    from porter.runtime import notices

    out = tmp_path / "out"
    with pytest.raises(NonFinite, match="denoising step 1 of 2 made NaN or infinite "
                                        "latents: stopped; kept: the encode stage") as info:
        run(tiny_recipe(tmp_path, out, nan_checkpoint, "model.allow_nonfinite=true"),
            registry_mod.loaded(), progress=False)
    assert info.value.exit_code == 2
    assert any("allowed by model.allow_nonfinite" in w for w in notices.given())
    assert artifacts.complete(out, "encode") and not artifacts.complete(out, "denoise")
    assert not (out / "video.mp4").exists()


def test_a_pipeline_run_in_one_piece_stops_at_nonfinite_latents(tmp_path, monkeypatch):
    """A CogVideoX whose transformer makes NaN stops at the step that made it: run in
    Porter's stages (keeping the encode stage), and as ``family: generic``, whose
    pipeline runs its own loop and is checked through the pipeline's step callback."""
    from porter.errors import NonFinite
    from porter_cogvideox.tiny import build_pipeline

    pipe = build_pipeline()
    with torch.no_grad():
        pipe.transformer.proj_out.weight[0, 0] = float("nan")
    pipe.save_pretrained(tmp_path / "nan")
    staged_out, generic_out = tmp_path / "staged", tmp_path / "generic"
    staged = recipe.load(RECIPES / "cogvideox-tiny.yaml", [
        f"model.source={tmp_path / 'nan'}", f"output.dir={staged_out}",
        "model.allow_nonfinite=true"])
    with pytest.raises(NonFinite, match=r"denoising step 1 of \d+ made NaN or infinite "
                                        r"latents: stopped; kept: the encode stage$"):
        run(staged, registry_mod.loaded(), progress=False)
    assert artifacts.complete(staged_out, "encode")
    loaded = recipe.load(RECIPES / "cogvideox-tiny.yaml", [
        "model.family=generic", f"model.source={tmp_path / 'nan'}", "rotary.precompute=false",
        f"output.dir={generic_out}", "model.allow_nonfinite=true"])
    with pytest.raises(NonFinite, match=r"denoising step 1 of \d+ made NaN or infinite "
                                        r"latents: stopped$"):
        run(loaded, registry_mod.loaded(), progress=False)
    for out in (staged_out, generic_out):
        assert not (out / "video.mp4").exists() and not (out / "run.json").exists()


def test_only_parameters_are_counted_not_buffers():
    """A mask buffer may hold -inf on purpose; a parameter may not."""
    from porter import runtime
    from porter.transforms import placement

    module = torch.nn.Linear(4, 4)
    with torch.no_grad():
        module.weight[0, 0] = float("nan")
    module.register_buffer("mask", torch.full((4,), float("-inf")))
    found = {}
    placement.apply(module, runtime.start(recipe.load(RECIPES / "wan-tiny.yaml")), [],
                    None, found)
    assert found == {"weight": 1}


def test_the_finiteness_check_counts_exactly():
    from porter.runtime import finite

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.randn(1000).to(dtype)
        assert finite.count(x) == 0
        x[[3, 500]] = float("nan")
        x[7] = float("-inf")
        assert finite.count(x) == 3
    assert finite.count(torch.arange(10)) == 0 and finite.count(torch.empty(0)) == 0
