"""A recipe's cache section: every problem found without weights, defaults as diffusers has
them, ratio files checked."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

import porter
from porter.errors import RecipeError

from support.stepcache import two_experts

slow = pytest.mark.slow  # these compile and run models


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
    from porter.registry import loaded as registry
    from porter.port.checks import recipe_problems

    overrides = [f"cache={cache}"]
    if cache == "{method: guidance}":
        overrides.append("generate.guidance_scale=1.0")
    loaded = recipe_mod.load(recipe_path, overrides)
    problems = recipe_problems(loaded, registry())
    assert any(message in p.message for p in problems), [str(p) for p in problems]
    assert all(p.path.startswith("cache") for p in problems)


def test_a_missing_ratio_file_says_where_a_relative_path_is_read_from(recipe_path,
                                                                        tmp_path):
    """From the command line, the current directory (as it is read); from the recipe
    file, the recipe's folder."""
    from porter import recipe as recipe_mod
    from porter.registry import loaded as registry
    from porter.port.checks import recipe_problems

    overridden = recipe_mod.load(recipe_path, ["cache={method: magcache, mag_ratios: r.json}"])
    [problem] = recipe_problems(overridden, registry())
    assert problem.hint.endswith(f"a relative path is read from {Path.cwd()}")
    written = tmp_path / "cached.yaml"
    written.write_text(f"extends: {recipe_path}\ncache: {{method: magcache, mag_ratios: r.json}}\n")
    [problem] = recipe_problems(recipe_mod.load(written), registry())
    assert problem.hint.endswith(f"a relative path is read from {tmp_path.resolve()}")


def test_unknown_parameter_lists_the_accepted_ones(recipe_path):
    from porter import recipe as recipe_mod
    from porter.registry import loaded as registry
    from porter.port.checks import recipe_problems

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
def test_the_first_block_cache_needs_two_blocks():
    from support import RECIPES

    with pytest.raises(RecipeError, match="needs two blocks or more; this transformer has 1"):
        porter.load(RECIPES / "cogvideox-tiny.yaml", "cache={method: first_block}")


def test_models_the_hooks_cannot_serve_are_recipe_errors(recipe_path):
    from porter import recipe as recipe_mod
    from porter.registry import loaded as registry
    from porter.stepcache import hooks, settings
    from porter.stepcache.session import fit_problems as cache_fit_problems
    from porter.transforms import sketch

    def cached_components(recipe, family, modules):  # the fit reads the modules' sketches
        problems = cache_fit_problems(recipe, family, {name: sketch.of(module)
                                                       for name, module in modules.items()})
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
    from porter.registry import loaded as registry
    from porter.port.checks import recipe_problems

    loaded = recipe_mod.load(recipe_path, ["cache={method: guidance}",
                                           "generate.cfg_parallel=true"])
    (problem,) = recipe_problems(loaded, registry())
    assert "one batched call" in problem.message and problem.hint == \
        "generate.cfg_parallel: false"


def test_a_cache_section_keeps_the_stored_traces(recipe_path):
    """Cached pieces are programs of their own names: the trace cache's key is the
    same with and without a cache section."""
    from porter import recipe as recipe_mod
    from porter.transforms.jit.traces import traced_settings

    plain = recipe_mod.load(recipe_path)
    cached = recipe_mod.load(recipe_path, ["cache={method: first_block}"])
    assert traced_settings(plain) == traced_settings(cached)


def test_a_step_cache_needs_the_runs_step_count(write):
    """A generic pipeline may run without generate.steps (its own count); a step cache's
    windows are fractions of the steps, so it asks for them."""
    from porter import registry as registry_mod, recipe
    from porter import stepcache as step_cache

    path = write("r.yaml", "model: {family: generic, source: ckpt}\ngenerate: {prompt: x}\n"
                 "cache: {method: first_block, threshold: 0.1}\n")
    family = registry_mod.loaded().family("generic")
    found = step_cache.problems(recipe.load(path), family)
    assert [(p.path, p.hint) for p in found] == [("generate.steps", "set generate.steps")]
