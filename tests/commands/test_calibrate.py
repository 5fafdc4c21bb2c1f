"""porter calibrate: MagCache's ratios written as a user runs it, and an expert that runs
no step refused."""

import json

import pytest

from porter.errors import RecipeError

from support.stepcache import two_experts

slow = pytest.mark.slow  # these compile and run models


@slow
def test_calibrate_then_run_as_a_user_does(recipe_path, tmp_path):
    """`porter calibrate` and a cached `porter run`, each in a fresh process."""
    from support.processes import user_porter

    ratios = tmp_path / "ratios.json"
    made = user_porter("calibrate", str(recipe_path), "generate.steps=6", "-o", str(ratios),
                        "--no-progress")
    assert made.returncode == 0, made.stderr
    assert f"wrote {ratios} (transformer: 6 steps)" in made.stdout
    assert "use it: cache: {method: magcache, mag_ratios:" in made.stdout
    out = tmp_path / "run"
    ran = user_porter("run", str(recipe_path), "generate.steps=10", f"output.dir={out}",
                       f"cache={{method: magcache, mag_ratios: {ratios}, threshold: 0.5}}",
                       "--no-progress")
    assert ran.returncode == 0, ran.stderr
    assert "cache magcache:" in ran.stdout and "transformer blocks computed" in ran.stdout
    record = json.loads((out / "run.json").read_text())
    assert record["timings"]["cache"]["calls"] == 20  # 10 steps, two branches
    assert record["recipe"]["cache"]["method"] == "magcache"
    bad = user_porter("run", str(recipe_path), "cache={method: magcache}", "--no-progress")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "MagCache needs the model's magnitude ratios" in bad.stderr


@slow
def test_calibrating_an_expert_that_runs_no_step_is_refused(tmp_path):
    from porter import recipe as recipe_mod
    from porter.commands.calibrate import calibrate

    path = two_experts(tmp_path, "steps: 1")
    with pytest.raises(RecipeError, match="transformer_2 ran no step of 1"):
        calibrate(recipe_mod.load(path), tmp_path / "ratios.json", progress=False)
    assert not (tmp_path / "ratios.json").exists()
