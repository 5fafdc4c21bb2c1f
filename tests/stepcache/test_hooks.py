"""Step caching: Porter's compiled pieces decide as diffusers' hooks do. Each method runs
on the tiny Wan pipeline through Porter and through plain diffusers with the same hook
configuration from the same seed: both skip the same steps (per guidance branch) and
give the same latents."""

import pytest
import torch

import porter
from porter.errors import RecipeError

from support.stepcache import (
    STEPS,
    diffusers_run,
    load,
    porter_run,
    same_as_diffusers,
    two_experts,
)

slow = pytest.mark.slow  # these compile and run models


@slow
def test_first_block_cache_matches_diffusers(recipe_path):
    from diffusers import FirstBlockCacheConfig
    summary = same_as_diffusers(recipe_path, ["cache.method=first_block",
                                              "cache.threshold=0.2"],
                                FirstBlockCacheConfig(threshold=0.2))
    # a skipped call still runs the first block
    assert summary["blocks_computed"] == summary["blocks_total"] - summary["skipped_calls"]


@slow
def test_taylorseer_matches_diffusers_with_blocks_predicted(recipe_path):
    from diffusers import TaylorSeerCacheConfig
    summary = same_as_diffusers(
        recipe_path, ["cache.method=taylorseer", "cache.cache_interval=3",
                      "cache.taylor_factors_dtype=float32"],
        TaylorSeerCacheConfig(cache_interval=3, taylor_factors_dtype=torch.float32,
                              cache_identifiers=[r"blocks\.\d+"]))
    assert summary["blocks_computed"] < summary["blocks_total"]


@slow
def test_calibration_matches_diffusers_and_magcache_follows_it(recipe_path, tmp_path):
    from diffusers import MagCacheConfig

    from porter.stepcache import calibration

    _, summary, port = porter_run(recipe_path, "cache.method=magcache",
                                  "cache.calibrate=true")
    assert summary["skipped_calls"] == 0
    ratios = summary["ratios"]["transformer"]
    expected: dict = {}
    # one more step than run: diffusers' calibration would forget them at the last one
    diffusers_run(port.recipe, MagCacheConfig(calibrate=True, num_inference_steps=STEPS + 1),
                  calibrate_into=expected)
    assert set(ratios) == {"cond", "uncond"} and len(ratios["cond"]) == STEPS
    for name in ratios:
        assert ratios[name] == pytest.approx(expected[name], rel=1e-4, abs=1e-5)

    file = calibration.write(tmp_path / "ratios.json", summary["ratios"], port.recipe, STEPS)
    overrides = ["cache.method=magcache", f"cache.mag_ratios={file}", "cache.threshold=0.5"]
    same_as_diffusers(recipe_path, overrides, MagCacheConfig(
        threshold=0.5, mag_ratios=ratios["cond"], num_inference_steps=STEPS))


@slow
def test_guidance_cache_reuses_the_difference_on_its_schedule(recipe_path):
    plain, _, _ = porter_run(recipe_path, "cache.method=guidance", "cache.interval=1")
    with load(recipe_path) as port:
        uncached = port.generate().latents
    assert torch.equal(plain, uncached)  # interval 1 reuses nothing: the same run, bit for bit
    latents, summary, port = porter_run(recipe_path, "cache.method=guidance",
                                        "cache.interval=3", "cache.start=0.25")
    # 12 steps, the window from step 4 (0.25 x 12, 1-based: 4): steps 4, 7, 10 compute both
    assert summary["skipped_steps"] == [5, 6, 8, 9, 11, 12]
    assert summary["blocks_computed"] == summary["blocks_total"] - 6 * 2  # 2 blocks a call
    reference, _ = diffusers_run(port.recipe)
    assert (plain - reference).abs().max() < 1e-4  # interval 1: nothing reused
    assert (latents - reference).abs().max() > 1e-4  # reused: not the same video
    assert torch.isfinite(latents).all()


@slow
def test_taylorseer_hooks_inside_a_compiled_block_are_refused(recipe_path):
    with pytest.raises(RecipeError, match="inside a compiled block, e.g. 'blocks.0.attn1'"):
        load(recipe_path, "cache={method: taylorseer, cache_identifiers: ['^blocks.*attn1']}")


@slow
def test_pipelines_own_loop_caches_as_diffusers_does():
    """HunyuanVideo runs its pipeline's own loop (one call a step, in the cond
    context, over two block lists): the first-block cache decides as diffusers'
    does."""
    from diffusers import FirstBlockCacheConfig

    from porter_hunyuan.tiny import build_pipeline

    from support import RECIPES

    with porter.load(RECIPES / "hunyuan-tiny.yaml", "generate.steps=10",
                     "cache={method: first_block, threshold: 0.3}") as port:
        made = port.generate()
    summary, gen = made.record["timings"]["cache"], port.recipe.generate
    pipe = build_pipeline()
    for module in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
        module.eval()
    calls, ran = [], []
    pipe.transformer.register_forward_pre_hook(lambda *_: calls.append(len(calls)))
    pipe.transformer.single_transformer_blocks[-1].proj_mlp.register_forward_hook(
        lambda *_: ran.append(calls[-1]))
    pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=0.3))
    reference = pipe(gen.prompt, height=gen.height, width=gen.width, num_frames=gen.frames,
                     num_inference_steps=gen.steps, guidance_scale=gen.guidance_scale,
                     max_sequence_length=16, generator=torch.Generator().manual_seed(gen.seed),
                     output_type="latent").frames
    skipped = [call + 1 for call in sorted(set(calls) - set(ran))]
    assert summary["skipped_steps"] == {"cond": skipped} and skipped
    assert summary["blocks_total"] == 2 * gen.steps
    assert (made.latents - reference).abs().max() < 1e-4


@slow
def test_two_experts_each_follow_their_own_ratios(tmp_path):
    """Wan 2.2 A14B's layout: each expert calibrated, then cached with its own ratios
    resampled to the steps it runs, as diffusers with one config per expert."""
    from diffusers import MagCacheConfig

    from porter.stepcache import calibration

    path = two_experts(tmp_path, "negative_prompt: blurry, steps: 16, guidance_scale: 4.0, "
                                 "seed: 1")
    with porter.load(path, "cache={method: magcache, calibrate: true}") as port:
        calibrated = port.generate(steps=12).record["timings"]["cache"]["ratios"]
        steps = port.family.transformer_steps(port.pipe, port.recipe)
    assert steps["transformer"] + steps["transformer_2"] == 16 and steps["transformer_2"]
    # each expert's calls of the 12-step calibration run, in each branch
    assert sum(len(r["cond"]) for r in calibrated.values()) == 12
    assert all(r["cond"] and len(r["uncond"]) == len(r["cond"]) for r in calibrated.values())
    file = calibration.write(tmp_path / "ratios.json", calibrated, port.recipe, 12)
    with porter.load(path, f"cache={{method: magcache, mag_ratios: {file}, "
                           "threshold: 0.5, retention_ratio: 0.1}") as port:
        made = port.generate()
    summary = made.record["timings"]["cache"]
    configs = [MagCacheConfig(threshold=0.5, retention_ratio=0.1,
                              mag_ratios=calibrated[name]["cond"],
                              num_inference_steps=steps[name])
               for name in ("transformer", "transformer_2")]
    reference, skipped = diffusers_run(port.recipe, configs, experts=2)
    assert summary["skipped_steps"] == skipped and summary["skipped_calls"] > 0
    assert any(step > steps["transformer"] for step in skipped["cond"])  # the second expert
    assert (made.latents - reference).abs().max() < 1e-4
