import json
import math

import pytest
from pydantic import ValidationError

from porter import recipe
from porter.errors import RecipeError

from support import RECIPES, TINY_RECIPE


def problems_of(path, overrides=()):
    with pytest.raises(RecipeError) as info:
        recipe.load(path, overrides)
    return info.value.problems


def test_shipped_tiny_recipe_loads():
    loaded = recipe.load(RECIPES / "wan-tiny.yaml")
    assert loaded.model.family == "wan"
    assert loaded.name == "wan-tiny"
    assert len(loaded.digest()) == 64


def test_every_problem_listed_with_file_line_and_key(write):
    path = write("bad.yaml", """\
model:
  famly: wan
  dtype: float8
mesh: {dp: two}
generate:
  prompt: hi
  height: "64"
  width: 64
  frames: 9
  stepz: 4
outptu: {}
""")
    found = {(p.path, p.line): p for p in problems_of(path)}
    assert set(found) == {
        ("model.famly", 2), ("model.family", 1), ("model.dtype", 3), ("mesh.dp", 4),
        ("generate.height", 7), ("generate.stepz", 10), ("outptu", 11)}
    assert all(p.file == str(path) for p in found.values())
    assert found[("model.famly", 2)].hint == "did you mean 'family'?"
    assert found[("generate.stepz", 10)].hint == "did you mean 'steps'?"
    assert found[("outptu", 11)].hint == "did you mean 'output'?"
    assert "'auto'" in found[("mesh.dp", 4)].message
    assert "'64'" in found[("generate.height", 7)].message  # the string is not coerced


def test_render_has_one_line_per_problem(write):
    path = write("bad.yaml", "model: {family: wan, dtpye: float32}\ngenerate: {prompt: x}\n")
    error = pytest.raises(RecipeError, recipe.load, path).value
    text = error.render()
    # dtpye (steps, height, width and frames are the family's to require)
    assert text.startswith("error: recipe has 1 problem")
    assert f"{path}:1: model.dtpye: unknown key 'dtpye'" in text


@pytest.mark.parametrize("family", ["wan", "cogvideox", "hunyuan"])
@pytest.mark.parametrize("key", ["prompt", "height", "width", "frames", "steps"])
def test_staged_families_need_a_prompt_a_size_frames_and_steps(write, family, key):
    from porter import registry as registry_mod
    from porter.port import checks

    generate = {"prompt": "x", "height": 32, "width": 32, "frames": 9, "steps": 2}
    del generate[key]
    text = f"model: {{family: {family}, source: tiny}}\ngenerate: {json.dumps(generate)}\n"
    path = write("r.yaml", text)
    [problem] = checks.recipe_problems(recipe.load(path), registry_mod.loaded())
    assert (problem.path, problem.message) == (f"generate.{key}",
                                              f"family {family!r} needs generate.{key}")


@pytest.mark.parametrize("key", ["video", "mask", "control_video", "pose_video", "latents",
                                 "conditions"])
def test_staged_families_refuse_input_videos(write, key):
    from porter import registry as registry_mod
    from porter.port import checks

    value = "[{frames: clip.mp4}]" if key == "conditions" else "clip.mp4"
    path = write("r.yaml", "model: {family: wan, source: tiny}\ngenerate: {prompt: x, "
                 f"height: 32, width: 32, frames: 9, steps: 2, {key}: {value}}}\n")
    [problem] = checks.recipe_problems(recipe.load(path), registry_mod.loaded())
    assert problem.path == f"generate.{key}" and "takes no input" in problem.message


def test_yaml_syntax_error_points_at_line(write):
    path = write("broken.yaml", "model:\n  family: wan\n  source: [tiny\ngenerate: {}\n")
    [problem] = problems_of(path)
    assert "YAML syntax error" in problem.message
    # where YAML stopped, and the bracket it was inside of
    assert problem.line == 4 and "(inside the [ list opened on line 3)" in problem.message


def test_an_unclosed_quote_is_found_where_it_opens(write):
    path = write("quote.yaml", 'model: {family: wan, source: tiny}\ngenerate:\n  prompt: "a '
                 'cat\n  steps: 2\n  height: 64\n')
    [problem] = problems_of(path)  # found at the file's end (line 6): mend line 3
    assert problem.line == 3 and "the quoted string opened here is never closed" in \
        problem.message
    # a badly indented key: where it is, not where its mapping started
    [problem] = problems_of(write("indent.yaml", "model:\n  family: wan\n   source: tiny\n"))
    assert problem.line == 3 and "opened" not in problem.message


def test_missing_file_is_a_recipe_error(tmp_path):
    [problem] = problems_of(tmp_path / "nope.yaml")
    assert "not found" in problem.message


def test_top_level_must_be_mapping(write):
    [problem] = problems_of(write("list.yaml", "- a\n- b\n"))
    assert "mapping" in problem.message


def test_overrides_are_type_checked(write):
    path = write("r.yaml", TINY_RECIPE)
    loaded = recipe.load(path, ["generate.steps=7", "mesh.tp=2", "generate.prompt=a dog"])
    assert loaded.generate.steps == 7 and loaded.mesh["tp"] == 2
    assert loaded.generate.prompt == "a dog"
    found = {p.path: p for p in problems_of(path, ["generate.steps=x", "generate.stepz=3",
                                                   "mesh.tp=two", "model.dtype=float8"])}
    assert set(found) == {"generate.steps", "generate.stepz", "mesh.tp", "model.dtype"}
    assert all(p.file == "overrides" for p in found.values())
    assert found["generate.stepz"].hint == "did you mean 'steps'?"


def test_a_key_at_the_wrong_level_is_found_where_it_belongs(write):
    path = write("r.yaml", TINY_RECIPE)
    found = {p.path: p for p in problems_of(path, ["height=64", "steps=2"])}
    assert found["height"].hint == "did you mean 'generate.height'?"
    assert found["steps"].hint == "did you mean 'generate.steps'?"
    # a top-level key written inside a section, and no key inside a list or mapping
    # of sections (lora[0].scale, compile.<component>.modules) offered as a section's
    found = {p.path: p for p in problems_of(path, ["generate.model=x", "modules=x"])}
    assert found["generate.model"].hint == \
        "'model' is a section of the recipe, not a key of generate"
    assert found["modules"].hint == "did you mean 'verify.modules'?"


def test_a_dotted_key_inside_its_section_is_named(write):
    """A job's or a call's settings are generate's: {"generate.steps": 2} there is the
    dotted path written as one key (it was offered 'timesteps', the nearest spelling)."""
    loaded = recipe.load(write("r.yaml", TINY_RECIPE))
    with pytest.raises(RecipeError) as refused:
        recipe.with_values(loaded, "generate", {"generate.steps": 2}, "request")
    [problem] = refused.value.problems
    assert problem.hint == "inside generate write 'steps' alone, not the dotted path"


def test_an_override_meant_as_a_list_that_is_not_yaml_says_why(write):
    path = write("r.yaml", TINY_RECIPE)
    [problem] = problems_of(path, ['sharding.activations.vae=[{module: "a\\.b", spec: []}]'])
    assert problem.path == "sharding.activations.vae" and problem.file == "overrides"
    assert "not YAML" in problem.message and "escape" in problem.message
    assert "single quotes" in problem.hint
    [problem] = problems_of(path, ["sharding.activations.vae={module: [a}"])
    assert "flow style" in problem.hint and "'\"...\"'" in problem.hint
    # a string with YAML punctuation in it, not bracketed as a whole, stays a string
    for prompt in ("a [b", "[cinematic] a cat", "{style} a cat, [blurry]"):
        assert recipe.load(path, [f"generate.prompt={prompt}"]).generate.prompt == prompt


def test_a_text_key_takes_its_override_as_typed(write):
    """A prompt is text whatever YAML would make of it: a '#' is not a comment that
    cuts it short, 'a: b' not a mapping, 1984 not a number, no not a boolean. Quoted,
    it is read as YAML (its escapes); null unsets it."""
    path = write("r.yaml", TINY_RECIPE)
    for prompt in ("a red fox #1 in the snow, 4k", "a fox: running", "1984", "no",
                   "[cinematic] a cat {style}"):
        loaded = recipe.load(path, [f"generate.prompt={prompt}",
                                    f"generate.negative_prompt={prompt}"])
        assert loaded.generate.prompt == loaded.generate.negative_prompt == prompt
    assert recipe.load(path, ['generate.prompt="a\\tb "']).generate.prompt == "a\tb "
    assert recipe.load(path, ["generate.prompt=null"]).generate.prompt is None
    # a path is text too: a '#' in a file name is the file's
    loaded = recipe.load(path, ["output.dir=shots/a #1", "generate.image=shots/a #1.png"])
    assert (loaded.output.dir, loaded.generate.image) == ("shots/a #1", "shots/a #1.png")
    # a key that is not text alone still reads YAML
    assert recipe.load(path, ["generate.steps=3"]).generate.steps == 3
    assert recipe.load(path, ["attention.skip=[vae]"]).attention.skip == ["vae"]


def test_a_colon_without_its_space_in_an_override_is_named(write):
    """{dp:2} is YAML for one key "dp:2" with no value: said as that, with the fix."""
    [problem] = problems_of(write("r.yaml", TINY_RECIPE), ["mesh={dp:2}"])
    assert problem.path == "mesh" and "reads 'dp:2' as one key with no value" in \
        problem.message and problem.hint.endswith("dp: 2")


def test_malformed_override(write):
    path = write("r.yaml", TINY_RECIPE)
    [problem] = problems_of(path, ["generate.steps"])
    assert "KEY.PATH=VALUE" in problem.message
    [problem] = problems_of(path, ["generate.prompt.x=1"])
    assert "not a section" in problem.message


def test_extends_deep_merges_relative_to_file(write):
    write("base/common.yaml", TINY_RECIPE + "output: {fps: 12}\n")
    child = write("base/sub/child.yaml",
                  "extends: ../common.yaml\ngenerate: {steps: 9}\nmesh: {tp: 1}\n")
    loaded = recipe.load(child)
    assert loaded.generate.steps == 9
    assert loaded.generate.prompt == "a cat"  # kept from the base
    assert loaded.output.fps == 12
    assert loaded.mesh == {"tp": 1}


def test_extends_problem_points_at_the_base_file(write):
    base = write("base.yaml", TINY_RECIPE.replace("steps: 3", "steps: three"))
    child = write("child.yaml", "extends: base.yaml\noutput: {fps: 8}\n")
    [problem] = problems_of(child)
    assert problem.file == str(base) and problem.path == "generate.steps"
    assert problem.line == 7


def test_extends_cycle_rejected(write):
    write("a.yaml", "extends: b.yaml\n")
    write("b.yaml", "extends: a.yaml\n")
    [problem] = problems_of(write("c.yaml", "extends: a.yaml\n"))
    assert "cycle" in problem.message and "a.yaml -> b.yaml -> a.yaml" in problem.message


def test_extends_missing_base(write):
    [problem] = problems_of(write("c.yaml", "extends: gone.yaml\n"))
    assert "not found" in problem.message and problem.line == 1


def test_recipe_is_immutable(write):
    loaded = recipe.load(write("r.yaml", TINY_RECIPE))
    with pytest.raises(ValidationError):
        loaded.generate.steps = 5


def test_mesh_axis_rules(write):
    path = write("r.yaml", TINY_RECIPE + "mesh: {dp: auto, tp: auto, sp: 0}\n")
    messages = " | ".join(p.message for p in problems_of(path))
    assert "at most one axis" in messages and ">= 1" in messages


@pytest.mark.parametrize("path", sorted(RECIPES.rglob("*.yaml")),
                         ids=lambda p: str(p.relative_to(RECIPES)))
def test_every_shipped_recipe_validates(path):
    from porter import registry as registry_mod
    from porter.commands.validate import validate

    text = path.read_text()
    relative = path.relative_to(RECIPES.parent)
    assert text.startswith((f"# porter run {relative}", f"# porter bench {relative}"))
    loaded = recipe.load(path)
    # a recipe for more chips than the test's 8 devices is checked for its own count
    chips = math.prod(size for size in loaded.mesh.values() if isinstance(size, int))
    assert validate(loaded, registry_mod.loaded(), chips if chips > 8 else None) == []


def test_a_layer_giving_a_schedule_gives_the_step_count(write):
    """A recipe, the overrides or a call that gives a schedule step by step and no
    count: the schedule counts the steps, whatever the recipe below said; a count given
    beside the schedule stands (and the scheduler's check holds it to the schedule)."""
    base = write("base.yaml", TINY_RECIPE)  # steps: 3
    child = write("child.yaml", "extends: base.yaml\ngenerate: {sigmas: [1.0, 0.5]}\n")
    assert recipe.load(child).generate.steps == 2
    assert not recipe.load(child).sets("generate.steps")
    assert recipe.load(base, ["generate.timesteps=[900, 600, 300, 100]"]).generate.steps == 4
    assert recipe.load(base, ["generate.timesteps=[900, 600]", "generate.steps=5"]) \
        .generate.steps == 5
    called = recipe.with_values(recipe.load(base), "generate", {"sigmas": [1.0]}, "call")
    assert called.generate.steps == 1
    kept = write("kept.yaml", "extends: base.yaml\ngenerate: {steps: 7, sigmas: [1.0]}\n")
    assert recipe.load(kept).generate.steps == 7
