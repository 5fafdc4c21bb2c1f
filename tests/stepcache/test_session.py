"""A port's step cache across runs and commands: sharded and batched guidance, a resumed
run, verify of a cached recipe."""

import pytest
import torch

import porter
from porter.errors import Interrupted
from porter.generate.call import Call

slow = pytest.mark.slow  # these compile and run models


@slow
def test_sharded_batched_guidance_keeps_working_with_a_cache():
    """wan-tiny-tp: weights over tp=4, the [cond, uncond] batch over dp=2, blockwise
    attention. A cache that skips nothing gives the uncached latents; MagCache with
    flat ratios skips on its schedule (retention 2 of 8 steps, at most 2 in a row)."""
    from support import RECIPES

    tp = RECIPES / "wan-tiny-tp.yaml"
    with porter.load(tp, "generate.steps=8") as port:
        plain = port.generate().latents
    with porter.load(tp, "generate.steps=8", "cache={method: first_block, threshold: 0.0}") \
            as port:
        made = port.generate()
    summary = made.record["timings"]["cache"]
    assert summary["calls"] == 8 and summary["skipped_calls"] == 0
    assert (made.latents - plain).abs().max() < 1e-5
    with porter.load(tp, "generate.steps=8",
                     "cache={method: magcache, mag_ratios: [1.0], max_skip_steps: 2}") as port:
        made = port.generate()
    assert made.record["timings"]["cache"]["skipped_steps"] == {"cond_uncond": [3, 4, 6, 7]}
    assert torch.isfinite(made.latents).all()


@slow
def test_verify_checks_the_port_of_a_cached_recipe(recipe_path):
    from porter import recipe as recipe_mod
    from porter.commands import verify
    from porter.registry import loaded as registry

    loaded = recipe_mod.load(recipe_path, ["cache={method: first_block, threshold: 0.9}"])
    assert verify.verify(loaded, registry())["ok"]


@slow
def test_a_resumed_cached_run_picks_up_its_schedule(recipe_path, tmp_path):
    """Stopped after step 4 of 8 and resumed: the cache starts cold at step 5, with a
    warning; MagCache's schedule goes on from there (flat ratios: at most 2 skipped in
    a row; retention, 2 of 8 steps, already past), and skipped steps keep the run's
    numbering."""
    from porter import registry as registry_mod
    from porter import recipe as recipe_mod
    from porter.commands.run import run
    from porter.runtime import interrupt

    out = tmp_path / "run"
    loaded = recipe_mod.load(recipe_path, [
        "generate.steps=8", f"output.dir={out}",
        "cache={method: magcache, mag_ratios: [1.0], max_skip_steps: 2}"])

    def stop_after_four(done, total):
        if done == 4:
            interrupt.request_stop()

    with porter.load(loaded) as port:
        whole = port.generate().record["timings"]["cache"]
        try:
            with pytest.raises(Interrupted):
                port.run(Call(loaded, directory=out, on_step=stop_after_four))
        finally:
            interrupt.clear_stop()
    assert whole["skipped_steps"] == {"cond": [3, 4, 6, 7], "uncond": [3, 4, 6, 7]}
    resumed = run(loaded, registry_mod.loaded(), progress=False, resume=True)
    summary = resumed.data["timings"]["cache"]
    assert summary["skipped_steps"] == {"cond": [6, 7], "uncond": [6, 7]}
    assert summary["calls"] == 8  # the four steps left, two branches each
    assert any("the step cache starts cold there" in w for w in resumed.data["warnings"])
