"""Step caching: Porter's compiled pieces decide as diffusers' hooks do.

Each method runs on the tiny Wan pipeline through Porter and through plain
diffusers with the same hook configuration from the same seed: both skip the
same steps (per guidance branch) and give the same latents.
"""

import dataclasses
import json

import pytest
import torch

import porter
from porter.generate.call import Call
from porter.errors import Interrupted, RecipeError

slow = pytest.mark.slow  # these compile and run models

STEPS = 12
SETTINGS = ("generate.steps=12", "generate.negative_prompt=blurry", "generate.seed=3")


def load(recipe_path, *overrides):
    return porter.load(recipe_path, *SETTINGS, *overrides)


@pytest.fixture(scope="module")
def recipe_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("cache") / "tiny.yaml"
    path.write_text("""\
model: {family: wan, source: tiny}
generate: {prompt: "a cat", height: 32, width: 32, frames: 9, steps: 3,
           guidance_scale: 5.0, max_sequence_length: 16}
rotary: {precompute: true}
""")
    return path


def two_experts(tmp_path, generate: str, extra: str = ""):
    """A recipe for the tiny Wan 2.2 two-expert layout; ``generate``: more settings."""
    path = tmp_path / "two.yaml"
    path.write_text("model: {family: wan, source: tiny, variant: t2v-two-experts}\n"
                    "generate: {prompt: 'a cat', height: 32, width: 32, frames: 9, "
                    f"max_sequence_length: 16, {generate}}}\n{extra}")
    return path


def diffusers_run(recipe, config=None, calibrate_into=None, experts: int = 1):
    """Latents and skipped steps per branch of plain diffusers' WanPipeline with
    ``config`` (a diffusers cache config, or one per transformer) enabled."""
    from porter_wan.tiny import build_pipeline

    gen = recipe.generate
    pipe = build_pipeline(experts=experts)
    models = [pipe.transformer] + ([pipe.transformer_2] if experts == 2 else [])
    for module in (*models, pipe.vae, pipe.text_encoder):
        module.eval()
    calls, ran = [], []
    configs = config if isinstance(config, list) else [config] * len(models)
    for model, each in zip(models, configs):
        model.register_forward_pre_hook(lambda *_: calls.append(len(calls)))
        # the last block's feed-forward runs only when the block is computed
        model.blocks[-1].ffn.register_forward_hook(lambda *_: ran.append(calls[-1]))
        if each is not None:
            model.enable_cache(each)
    if calibrate_into is not None:
        tail = pipe.transformer.blocks[-1]._diffusers_hook.get_hook("mag_cache_block_hook")
        original = tail._perform_calibration_step

        def recorded(state, residual):
            original(state, residual)
            name = tail.state_manager._context.name
            calibrate_into.setdefault(name, []).append(state.calibration_ratios[-1])
        tail._perform_calibration_step = recorded
    latents = pipe(gen.prompt, negative_prompt=gen.negative_prompt, height=gen.height,
                   width=gen.width, num_frames=gen.frames, num_inference_steps=gen.steps,
                   guidance_scale=gen.guidance_scale,
                   max_sequence_length=gen.max_sequence_length,
                   generator=torch.Generator().manual_seed(gen.seed),
                   output_type="latent").frames
    skipped: dict = {}
    for call in sorted(set(calls) - set(ran)):  # WanPipeline: cond, uncond per step
        skipped.setdefault(("cond", "uncond")[call % 2], []).append(call // 2 + 1)
    return latents, skipped


def porter_run(recipe_path, *overrides):
    with load(recipe_path, *overrides) as port:
        made = port.generate()
    return made.latents, made.record["timings"]["cache"], port


def same_as_diffusers(recipe_path, overrides, config):
    latents, summary, port = porter_run(recipe_path, *overrides)
    reference, skipped = diffusers_run(port.recipe, config)
    assert summary["skipped_steps"] == skipped
    assert summary["skipped_calls"] > 0, "the configuration should skip something"
    assert (latents - reference).abs().max() < 1e-4
    return summary


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


@pytest.mark.parametrize("cache, message", [
    ("{method: teacache}", "unknown method 'teacache'"),
    ("{method: magcache, treshold: 0.1, mag_ratios: [1.0]}", "magcache takes no parameter"),
    ("{method: first_block, threshold: -1}", "greater than or equal to 0"),
    ("{method: magcache}", "MagCache needs the model's magnitude ratios"),
    ("{method: magcache, mag_ratios: nowhere.json}", "'nowhere.json' is not a file"),
    ("{method: guidance}", "needs classifier-free guidance"),
    ("{method: guidance, start: 0.5, end: 0.5}", "the window starts (0.5) at or after"),
    ("{method: magcache, mag_ratios: {a: 1}}", "a file `porter calibrate` wrote, or a list"),
])
def test_bad_cache_sections_are_recipe_errors(recipe_path, cache, message):
    from porter import recipe as recipe_mod
    from porter.port.checks import recipe_problems
    from porter.plugins import registry

    overrides = [f"cache={cache}"]
    if cache == "{method: guidance}":
        overrides.append("generate.guidance_scale=1.0")
    loaded = recipe_mod.load(recipe_path, overrides)
    problems = recipe_problems(loaded, registry())
    assert any(message in p.message for p in problems), [str(p) for p in problems]
    assert all(p.path.startswith("cache") for p in problems)


def test_unknown_parameter_lists_the_accepted_ones(recipe_path):
    from porter import recipe as recipe_mod
    from porter.port.checks import recipe_problems
    from porter.plugins import registry

    loaded = recipe_mod.load(recipe_path, ["cache={method: first_block, interval: 2}"])
    (problem,) = recipe_problems(loaded, registry())
    assert problem.path == "cache.interval" and problem.hint == "first_block takes: threshold"


def test_defaults_are_diffusers_defaults():
    from diffusers import FirstBlockCacheConfig, MagCacheConfig, TaylorSeerCacheConfig
    from porter.stepcache.methods import METHODS

    theirs = {"magcache": MagCacheConfig, "first_block": FirstBlockCacheConfig,
              "taylorseer": TaylorSeerCacheConfig}
    for method, config in theirs.items():
        defaults = {f.name: f.default for f in dataclasses.fields(config)}
        for name, field in METHODS[method].model_fields.items():
            if name in ("method", "mag_ratios"):
                continue
            expected = defaults[name]
            if isinstance(expected, torch.dtype):
                expected = str(expected).removeprefix("torch.")
            assert field.default == expected, (method, name)


def test_ratio_files_are_checked(tmp_path):
    from porter.stepcache import calibration

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": calibration.KIND, "ratios": {"transformer": [1]}}))
    with pytest.raises(ValueError, match="lists of numbers per context"):
        calibration.read(bad)


@slow
def test_one_list_for_two_experts_is_refused(tmp_path):
    path = two_experts(tmp_path, "steps: 4",
                       "cache: {method: magcache, mag_ratios: [1.0, 1.0, 1.0, 1.0]}\n")
    with pytest.raises(RecipeError, match="one list of ratios, 2 transformers"):
        porter.load(path)  # refused when porting, before anything is compiled


@slow
def test_taylorseer_hooks_inside_a_compiled_block_are_refused(recipe_path):
    with pytest.raises(RecipeError, match="inside a compiled block, e.g. 'blocks.0.attn1'"):
        load(recipe_path, "cache={method: taylorseer, cache_identifiers: ['^blocks.*attn1']}")


@slow
def test_calibrate_then_run_as_a_user_does(recipe_path, tmp_path):
    """`porter calibrate` and a cached `porter run`, each in a fresh process."""
    from test_cli import fresh_porter

    ratios = tmp_path / "ratios.json"
    made = fresh_porter("calibrate", str(recipe_path), "generate.steps=6", "-o", str(ratios),
                        "--no-progress")
    assert made.returncode == 0, made.stderr
    assert f"wrote {ratios} (transformer: 6 steps)" in made.stdout
    assert "use it: cache: {method: magcache, mag_ratios:" in made.stdout
    out = tmp_path / "run"
    ran = fresh_porter("run", str(recipe_path), "generate.steps=10", f"output.dir={out}",
                       f"cache={{method: magcache, mag_ratios: {ratios}, threshold: 0.5}}",
                       "--no-progress")
    assert ran.returncode == 0, ran.stderr
    assert "cache magcache:" in ran.stdout and "transformer blocks computed" in ran.stdout
    record = json.loads((out / "run.json").read_text())
    assert record["timings"]["cache"]["calls"] == 20  # 10 steps, two branches
    assert record["recipe"]["cache"]["method"] == "magcache"
    bad = fresh_porter("run", str(recipe_path), "cache={method: magcache}", "--no-progress")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "MagCache needs the model's magnitude ratios" in bad.stderr


@slow
def test_pipelines_own_loop_caches_as_diffusers_does():
    """HunyuanVideo runs its pipeline's own loop (one call a step, in the cond
    context, over two block lists): the first-block cache decides as diffusers'
    does."""
    from diffusers import FirstBlockCacheConfig
    from porter_hunyuan.tiny import build_pipeline

    from conftest import RECIPES

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
def test_the_first_block_cache_needs_two_blocks():
    from conftest import RECIPES

    with pytest.raises(RecipeError, match="needs two blocks or more; this transformer has 1"):
        porter.load(RECIPES / "cogvideox-tiny.yaml", "cache={method: first_block}")


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


def test_models_the_hooks_cannot_serve_are_recipe_errors(recipe_path):
    from porter import recipe as recipe_mod
    from porter.stepcache import hooks, settings
    from porter.plugins import registry
    from porter.stepcache.session import fit_problems as cache_fit_problems

    def cached_components(recipe, family, modules):
        problems = cache_fit_problems(recipe, family, modules)
        if problems:
            raise RecipeError(problems)

    loaded = recipe_mod.load(recipe_path, ["cache={method: first_block}"])
    wan = registry().family("wan")
    with pytest.raises(RecipeError, match="has none"):  # no block list at all
        cached_components(loaded, wan, {"transformer": torch.nn.Linear(2, 2)})

    class Unknown(torch.nn.Module):  # a block class diffusers' registry does not know
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)])

    with pytest.raises(RecipeError, match="do not know the block class Linear") as caught:
        cached_components(loaded, wan, {"transformer": Unknown()})
    assert caught.value.problems[0].path == "cache.method"
    with pytest.raises(hooks.Misfit):
        hooks.check(Unknown(), settings(loaded))


def test_guidance_cache_and_cfg_parallel_are_refused_together(recipe_path):
    from porter import recipe as recipe_mod
    from porter.port.checks import recipe_problems
    from porter.plugins import registry

    loaded = recipe_mod.load(recipe_path, ["cache={method: guidance}",
                                           "generate.cfg_parallel=true"])
    (problem,) = recipe_problems(loaded, registry())
    assert "one batched call" in problem.message and problem.hint == \
        "generate.cfg_parallel: false"


def test_a_cache_section_keeps_the_stored_traces(recipe_path):
    """Cached pieces are programs of their own names: the trace cache's key is the
    same with and without a cache section."""
    from porter import recipe as recipe_mod
    from porter.transforms.compile.traces import traced_settings

    plain = recipe_mod.load(recipe_path)
    cached = recipe_mod.load(recipe_path, ["cache={method: first_block}"])
    assert traced_settings(plain) == traced_settings(cached)


@slow
def test_bench_compares_a_pipeline_loop_with_and_without_its_cache():
    from porter import recipe as recipe_mod
    from porter.commands import bench

    from conftest import RECIPES

    loaded = recipe_mod.load(RECIPES / "hunyuan-tiny.yaml",
                             ["generate.steps=10", "cache={method: first_block, threshold: 0.3}"])
    result = bench.cache_compared(loaded)
    assert result["method"] == "first_block" and result["blocks_total"] == 20
    assert result["denoise_s"]["cached"] > 0 and result["denoise_s"]["uncached"] > 0
    assert result["blocks_computed"] == 16 and result["latents_relative_l2"] > 0  # 4 skipped
    assert "cache first_block: denoise" in bench.render_cache(result)


@slow
def test_calibrating_an_expert_that_runs_no_step_is_refused(tmp_path):
    from porter import recipe as recipe_mod
    from porter.commands.calibrate import calibrate

    path = two_experts(tmp_path, "steps: 1")
    with pytest.raises(RecipeError, match="transformer_2 ran no step of 1"):
        calibrate(recipe_mod.load(path), tmp_path / "ratios.json", progress=False)
    assert not (tmp_path / "ratios.json").exists()


@slow
def test_sharded_batched_guidance_keeps_working_with_a_cache():
    """wan-tiny-tp: weights over tp=4, the [cond, uncond] batch over dp=2, blockwise
    attention. A cache that skips nothing gives the uncached latents; MagCache with
    flat ratios skips on its schedule (retention 2 of 8 steps, at most 2 in a row)."""
    from conftest import RECIPES

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
    from porter.plugins import registry

    loaded = recipe_mod.load(recipe_path, ["cache={method: first_block, threshold: 0.9}"])
    assert verify.verify(loaded, registry())["ok"]


@slow
def test_a_resumed_cached_run_picks_up_its_schedule(recipe_path, tmp_path):
    """Stopped after step 4 of 8 and resumed: the cache starts cold at step 5, with a
    warning; MagCache's schedule goes on from there (flat ratios: at most 2 skipped in
    a row; retention, 2 of 8 steps, already past), and skipped steps keep the run's
    numbering."""
    from porter.runtime import interrupt
    from porter import plugins
    from porter import recipe as recipe_mod
    from porter.commands.run import run

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
    resumed = run(loaded, plugins.registry(), progress=False, resume=True)
    summary = resumed.data["timings"]["cache"]
    assert summary["skipped_steps"] == {"cond": [6, 7], "uncond": [6, 7]}
    assert summary["calls"] == 8  # the four steps left, two branches each
    assert any("the step cache starts cold there" in w for w in resumed.data["warnings"])


def test_a_step_cache_needs_the_runs_step_count(write):
    """A generic pipeline may run without generate.steps (its own count); a step cache's
    windows are fractions of the steps, so it asks for them."""
    from porter import stepcache as step_cache, plugins, recipe

    path = write("r.yaml", "model: {family: generic, source: ckpt}\ngenerate: {prompt: x}\n"
                 "cache: {method: first_block, threshold: 0.1}\n")
    family = plugins.registry().family("generic")
    found = step_cache.problems(recipe.load(path), family)
    assert [(p.path, p.hint) for p in found] == [("generate.steps", "set generate.steps")]
