"""Recipe files as YAML: alias bombs, deep nesting, huge numbers, duplicate keys, malformed
files and hostile extends are refused quickly, in little memory, at their line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
import yaml

from porter import recipe
from porter.errors import RecipeError
from porter.recipe import yamlio

from support import ROOT, TINY_RECIPE
from support.hostile import BOMBS, bounded_refusal, nested, refusal

pytestmark = pytest.mark.usefixtures("warm")  # timed: JAX and the models imported first


@pytest.mark.parametrize("kind", BOMBS)
def test_alias_bomb_refused_quickly_in_little_memory(write, kind):
    path = write("bomb.yaml", BOMBS[kind])
    text = bounded_refusal(path, seconds=5, megabytes=20)
    assert f"expands to more than {yamlio.MAX_NODES} YAML nodes" in text
    assert "billion laughs" in text
    assert re.search(rf"{re.escape(str(path))}:\d+: ", text)  # file:line of the alias


def test_alias_bomb_in_an_override_refused(write):
    bomb = "[" + ", ".join(["&a0 [x, x, x, x, x, x, x, x, x, x]"]
                           + [f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]"
                              for i in range(1, 10)]) + "]"
    start = time.monotonic()
    text = refusal(write("r.yaml", TINY_RECIPE), f"generate.extra={{v: {bomb}}}", seconds=5)
    assert time.monotonic() - start < 5
    assert "overrides: generate.extra: override the document expands" in text


def test_recursive_alias_refused(write):
    text = refusal(write("r.yaml", TINY_RECIPE + "loop: &me [1, *me]\n"))
    assert "alias *me is inside its own anchor &me" in text
    text = refusal(write("m.yaml", TINY_RECIPE + "loop: &me {a: *me}\n"))
    assert "inside its own anchor" in text


def test_plain_aliases_still_work(write):
    path = write("r.yaml", TINY_RECIPE.replace('prompt: "a cat"', "prompt: &p a cat")
                 + "output: {dir: *p}\n")
    assert recipe.load(path).output.dir == "a cat"


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_deep_nesting_refused(write, kind):
    deep = "[" * 2000 + "]" * 2000 if kind == "list" else "{a: " * 2000 + "1" + "}" * 2000
    text = bounded_refusal(write("deep.yaml", TINY_RECIPE + "x: " + deep + "\n"),
                           seconds=5, megabytes=20)
    assert f"nested more than {yamlio.MAX_DEPTH} levels deep" in text
    shallow = write("ok.yaml", TINY_RECIPE + "generate_extra: "
                    + yaml.safe_dump(nested(20, kind), default_flow_style=True))
    assert "unknown key 'generate_extra'" in refusal(shallow)  # depth 20 reads fine


def test_too_many_nodes_refused(write):
    items = ", ".join(["x"] * (yamlio.MAX_NODES + 1))
    text = refusal(write("wide.yaml", TINY_RECIPE + f"patches: [{items}]\n"), seconds=30)
    assert "expands to more than" in text


def test_huge_integers_refused_or_described(write):
    text = refusal(write("r.yaml", TINY_RECIPE.replace("steps: 3", "steps: " + "9" * 5000)))
    assert "an integer of 5000 digits is too large" in text and "r.yaml:7: " in text
    # A Python caller can hand over what YAML cannot: the message still prints.
    data = yaml.safe_load(TINY_RECIPE)
    data["generate"]["seed"] = -10**5000
    data["generate"]["steps"] = [10**5000] * 100_000
    with pytest.raises(RecipeError) as info:
        recipe.validate_data(data, {})
    assert "-bit integer>" in info.value.render()


def test_mesh_sizes_and_axes_are_bounded(write):
    text = refusal(write("r.yaml", TINY_RECIPE + "mesh: {dp: " + "9" * 90 + "}\n"))
    assert "less than or equal to 1048576" in text
    axes = ", ".join(f"a{i}: 2" for i in range(40))
    assert "at most 16 axes" in refusal(write("m.yaml", TINY_RECIPE + f"mesh: {{{axes}}}\n"))


@pytest.mark.parametrize("value,expected", [
    ("!!int abc", "cannot read 'abc' as int"),
    ("!!float x", "cannot read 'x' as float"),
    ("!!bool maybe", "cannot read 'maybe' as bool"),
    ("!!timestamp yesterday", "cannot read 'yesterday' as timestamp"),
    ("2024-13-45", "cannot read '2024-13-45' as timestamp"),
    ("!foo bar", "YAML tag '!foo' is not allowed"),
    ("!!python/name:os.system", "is not allowed in a recipe"),
    ("*nowhere", "found undefined alias"),
])
def test_unreadable_scalars_are_recipe_errors_at_their_line(write, value, expected):
    text = refusal(write("r.yaml", TINY_RECIPE.replace("steps: 3", f"steps: {value}")))
    assert expected in text and "r.yaml:7: " in text


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_numbers_are_finite(write, value):
    text = refusal(write("r.yaml", TINY_RECIPE + f"  guidance_scale: {value}\n"))
    assert "generate.guidance_scale: expected a finite number" in text


def test_duplicate_keys_refused(write):
    text = refusal(write("r.yaml", TINY_RECIPE + "model: {family: cogvideox}\n"))
    assert "duplicate key 'model' (first on line 1)" in text and "r.yaml:9: " in text
    text = refusal(write("n.yaml", TINY_RECIPE.replace("steps: 3", "steps: 3\n  steps: 4")))
    assert "duplicate key 'steps'" in text
    # a merge key's values may be overridden explicitly: that is not a duplicate
    merged = write("m.yaml", "model: {family: wan, source: tiny}\ngenerate:\n  <<: "
                   "{prompt: a, height: 32, width: 32, frames: 9, steps: 3}\n  steps: 5\n")
    assert recipe.load(merged).generate.steps == 5


@pytest.mark.parametrize("content,expected", [
    (b"", "generate: missing required key"),
    (b"\xff\xfe\x00binary", "cannot read recipe"),
    (b"model: {family: wan}\n\x00\n", "r.yaml:2: character U+0000 is not allowed in YAML"),
    (b"model: {family: \x1b[31mwan}\n", "character U+001B is not allowed"),
    (b"- a\n- b\n", "expected a mapping at the top level, got list"),
    (b"42\n", "expected a mapping at the top level, got int"),
    (b"model:\n\tfamily: wan\n", "YAML syntax error"),
    (b"---\na: 1\n---\nb: 2\n", "YAML syntax error"),
    (b"x" * (yamlio.MAX_BYTES + 1), f"a recipe is at most {yamlio.MAX_BYTES}"),
])
def test_malformed_files_are_recipe_errors(write, tmp_path, content, expected):
    path = tmp_path / "r.yaml"
    path.write_bytes(content)
    assert expected in refusal(path)


@pytest.mark.parametrize("target,expected", [
    ("recipe.yaml", "extends cycle: recipe.yaml -> recipe.yaml"),
    ("./recipe.yaml", "extends cycle"),
    ("missing.yaml", "base recipe 'missing.yaml' not found"),
    ("subdir", "extends: base recipe 'subdir' is a directory"),
    ("''", "extends: base recipe '' is a directory"),
    ("fifo", "extends: base recipe 'fifo' is not a regular file"),
    ("/dev/null", "extends: base recipe '/dev/null' is not a regular file"),
    ("loop_a", "not found"),
    ("[a, b]", "expected a file name (string)"),
    ("{a: 1}", "expected a file name (string)"),
    ("x" * 300, "not found"),
])
def test_hostile_extends_refused(lab, target, expected):
    path = lab / "recipe.yaml"
    path.write_text(f"extends: {target}\n" + TINY_RECIPE)
    text = refusal(path, seconds=5)
    assert expected in text and f"{path}:1: " in text


def test_extends_through_a_merge_key_is_located(lab):
    path = lab / "recipe.yaml"
    path.write_text("<<: {extends: 5}\n" + TINY_RECIPE)
    assert "recipe.yaml:1: extends: expected a file name" in refusal(path)


def test_long_extends_chain_refused(tmp_path):
    for index in range(40):
        (tmp_path / f"r{index}.yaml").write_text(f"extends: r{index + 1}.yaml\n")
    (tmp_path / "r40.yaml").write_text(TINY_RECIPE)
    assert f"more than {recipe.MAX_EXTENDS} recipes extend" in refusal(tmp_path / "r0.yaml")


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom", "FIFO", "DIR"])
def test_endless_files_refused_in_a_guarded_process(tmp_path, target):
    """A file that never ends (or never opens) is refused by its kind, before any read.
    Run in a child with a memory cap and a timeout, so a regression fails, not hangs."""
    if target == "FIFO":
        os.mkfifo(tmp_path / "fifo")
        target = str(tmp_path / "fifo")
    elif target == "DIR":
        target = str(tmp_path)
    if not os.path.exists(target):
        pytest.skip(f"{target} is not on this system")
    child = tmp_path / "child.yaml"
    child.write_text(f"extends: {target}\n" + TINY_RECIPE)
    script = textwrap.dedent("""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        from porter import recipe
        from porter.errors import RecipeError
        for path in sys.argv[1:]:
            try:
                recipe.load(path)
            except RecipeError as exc:
                print(exc.render())
    """)
    out = subprocess.run([sys.executable, "-c", script, target, str(child)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    reason = "is a directory" if target == str(tmp_path) else "is not a regular file"
    assert out.stdout.count(reason) == 2, out.stdout


def test_a_number_with_an_exponent_and_no_dot_is_a_number(write):
    """YAML 1.1 reads 1e-6 as a string; Porter prints tolerances that way, users copy it."""
    path = write("r.yaml", TINY_RECIPE + "verify: {tolerance: 1e-6}\n")
    assert recipe.load(path).verify.tolerance == 1e-6
    assert recipe.load(path, ["verify.tolerance=5E-2"]).verify.tolerance == 0.05
    for text, value in (("-2e+3", -2000.0), (".5e1", 5.0), ("1_0e1", 100.0)):
        assert yamlio.parse_value(text) == value
    for text in (".e5", "-e5", "e5", "1e", "1e-6x"):  # no digits before it: a string
        assert yamlio.parse_value(text) == text
