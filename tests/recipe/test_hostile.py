"""Hostile recipes: whatever a recipe file holds, `porter validate` either accepts it or
refuses it with a UsageError (a RecipeError for the recipe itself, exit code 2); never
another exception, never a hang, never unbounded memory. Property-based: valid seed
recipes mutated at the data level and at the text level."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from porter import registry as registry_mod, recipe
from porter.errors import RecipeError, UsageError
from porter.port import checks

from support import RECIPES
from support.hostile import (
    BILLION_LAUGHS,
    QUICK_SEEDS,
    SEED_DATA,
    SEEDS,
    dump,
    get,
    nested,
    paths,
    peak_rss_mb,
    validates_or_refuses,
    within,
)

pytestmark = pytest.mark.usefixtures("warm")  # timed: JAX and the models imported first


NASTY_STRINGS = [
    "", " ", "\t", "\n\n", "auto", "tiny", "null", "~", "~nosuchuser/x", "/", ".", "..",
    "/dev/zero", "/dev/null", "fifo", "loop_a", "subdir", "base.yaml", "recipe.yaml",
    "missing.yaml", "a\0b", "x" * 300, "x/" * 3000, "y" * 100_000, "é🦊\u202e\u0000end",
    "\ud800", "${HOME}", "{{7*7}}", "%s%n", "os.system", "subprocess:Popen",
    "builtins.eval", "!!python/object/apply:os.system", "*alias", "&anchor", "- a",
    "a: b", "'", '"', "\\", "(a+)+$", "[", "blocks\\.\\d+", "org/name", "../../etc/passwd",
]


NASTY_NUMBERS = [0, -1, 1, 7, 2**31, -2**31, 2**63, 2**64 + 1, 10**30, 10**99, 10**200,
                 2**10000, 0.5, -0.0, 1e308, float("inf"), float("-inf"), float("nan")]


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(),
    st.text(max_size=24), st.sampled_from(NASTY_STRINGS), st.sampled_from(NASTY_NUMBERS),
)


keys = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["extends", "model", "generate", "family", "source", "config", "mesh",
                     "<<", "weights", "spec", "match", "name", "params", "", "__class__"]),
    st.integers(-3, 3), st.none(), st.booleans())


values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(keys, inner, max_size=4)),
    max_leaves=10)


big_values = st.one_of(
    st.builds(nested, st.integers(1, 60), st.sampled_from(["list", "dict"])),
    st.integers(1000, 5000).map(lambda n: ["x"] * n),
    st.integers(100, 2000).map(lambda n: {f"k{i}": i for i in range(n)}),
)


PLAUSIBLE_STRINGS = ["dp", "tp", "sp", "auto", "vae", "transformer", "text_encoder", "forward",
                     "decode", "blockwise", "splash", "cudnn", "xla", "float16", "bfloat16",
                     "core.report_compiling", "wan.rope_cache", ".*", "blocks\\.\\d+",
                     "blocks\\.0\\..*", "(", "t2v", "i2v", "v1.5", "1.5", "generic", "tiny"]


def like(value):
    """A value of the same kind: it passes the schema more often and so reaches the
    plugin, mesh and shape checks behind it."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.one_of(st.integers(-2, 20), st.integers(0, 2**16),
                         st.sampled_from([2**20, 2**31 - 1, 8191, 8192, 4096, 10000]))
    if isinstance(value, float):
        return st.one_of(st.floats(-1, 1e6, allow_nan=False), st.sampled_from([0.0, 1e-30]))
    if isinstance(value, str) or value is None:
        return st.one_of(st.sampled_from(PLAUSIBLE_STRINGS), st.text(max_size=8))
    if isinstance(value, list):
        return st.lists(st.sampled_from(value), max_size=len(value) + 2) if value else \
            st.lists(st.sampled_from(PLAUSIBLE_STRINGS), max_size=3)
    return st.just(value)


@st.composite
def mutated(draw, seeds=SEEDS):
    """(seed name, data): a seed recipe after one to three mutations."""
    name = draw(st.sampled_from(seeds))
    data = copy.deepcopy(SEED_DATA[name])
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(list(paths(data))))
        op = draw(st.sampled_from(["like", "like", "replace", "replace", "delete", "add",
                                   "big", "alias"]))
        target = get(data, where)
        if op == "add" and isinstance(target, dict):
            target[draw(keys)] = draw(values)
        elif op == "add" and isinstance(target, list):
            target.append(draw(values))
        elif where == ():
            data = draw(values)  # the whole document: a scalar, a list, ...
            break
        elif op == "like":
            get(data, where[:-1])[where[-1]] = draw(like(target))
        elif op == "delete":
            del get(data, where[:-1])[where[-1]]
        elif op == "alias":  # the same object twice: YAML dumps an anchor and an alias
            other = draw(st.sampled_from(list(paths(data))))
            if other and other[: len(where)] != where and where[: len(other)] != other:
                get(data, where[:-1])[where[-1]] = get(data, other)
            break  # one sharing, on a tree: no cycles (those are tested on their own)
        else:
            get(data, where[:-1])[where[-1]] = draw(big_values if op == "big" else values)
    return name, data


# Reproducible (derandomize, no example database) and modest: the file runs in
# about a minute on a slow machine. No deadline: time is bounded by within().
HOSTILE = settings(deadline=None, derandomize=True, database=None, print_blob=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                          HealthCheck.filter_too_much,
                                          HealthCheck.large_base_example])


@settings(HOSTILE, max_examples=150)
@given(case=mutated())
def test_mutated_recipes_load_or_raise_recipe_error(lab, case):
    """Data-level mutations of every seed through load and the plugin checks (no JAX)."""
    _, data = case
    path = lab / "recipe.yaml"
    path.write_text(dump(data), encoding="utf-8")
    try:
        with within(10):
            loaded = recipe.load(path)
            for problem in checks.recipe_problems(loaded, registry_mod.loaded()):
                assert problem.render()
    except RecipeError as exc:
        assert exc.problems and exc.render().startswith("error: recipe has ")
    except UsageError as exc:
        assert exc.exit_code == 2 and exc.render().startswith("error: ")


@settings(HOSTILE, max_examples=80)
@given(case=mutated(QUICK_SEEDS))
def test_mutated_recipes_through_porter_validate(lab, case):
    """The same mutations through everything `porter validate` runs (mesh, shapes)."""
    _, data = case
    path = lab / "recipe.yaml"
    path.write_text(dump(data), encoding="utf-8")
    before = peak_rss_mb()
    validates_or_refuses(path)
    assert peak_rss_mb() - before < 300


SNIPPETS = [
    BILLION_LAUGHS, "!!python/object/apply:os.system [\"echo pwned\"]",
    "!!python/name:os.system", "!!python/module:os", "!!python/object/new:dict {}",
    "!foo bar", "!!binary aGVsbG8=", "!!set {a, b}", "!!omap [a: 1]", "!!int abc",
    "!!float x", "!!bool maybe", "!!timestamp yesterday", "2024-13-45", "!!str", "!!map",
    "&a [*a]", "*undefined", "<<: *undefined", "<<: 3", "&x {a: 1}", "*x", "? [a]\n: b",
    "{", "[", "]", "'", '"', "- - - -", "%YAML 1.1\n---", "---\n---\n", "...", "@", "`",
    "\t", "\x00", "\x1b[31m", "\ufeff", "\r\n", "\u2028", "0x" + "f" * 300, "1" * 5000,
    "1e99999", ".nan", "-.inf", "~", "null", "extends: recipe.yaml", "extends: /dev/zero",
    "extends: fifo", "extends: loop_a", "extends: subdir", "extends: [a]", "extends: ''",
    "model: {family: wan}", "x: " + "[" * 40 + "]" * 40, "x: " + "{a: " * 40 + "1" + "}" * 40,
]


@st.composite
def text_mutated(draw):
    """Seed recipe text with snippets spliced in, lines duplicated, junk bytes, cuts."""
    name = draw(st.sampled_from(QUICK_SEEDS))
    lines = (RECIPES / name).read_text().splitlines(keepends=True)
    lines = [line.replace("extends: wan-tiny.yaml",
                          f"extends: {RECIPES / 'wan-tiny.yaml'}") for line in lines]
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(lines)))
        op = draw(st.sampled_from(["line", "value", "duplicate", "cut", "whole"]))
        snippet = draw(st.sampled_from(SNIPPETS) | st.text(max_size=30))
        if op == "line":
            lines.insert(at, snippet + "\n")
        elif op == "value" and at < len(lines) and ":" in lines[at]:
            key = lines[at].split(":", 1)[0]
            lines[at] = f"{key}: {snippet}\n"
        elif op == "duplicate" and at < len(lines):
            lines.insert(at, lines[at])
        elif op == "cut":
            lines = lines[:at]
        elif op == "whole":
            lines = [snippet]
    text = "".join(lines).encode("utf-8", "surrogatepass")
    if draw(st.booleans()):
        junk = draw(st.binary(max_size=16))
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] + junk + text[cut:]
    return text


@settings(HOSTILE, max_examples=120)
@given(text=text_mutated())
def test_text_mutations_through_porter_validate(lab, text):
    path = lab / "recipe.yaml"
    path.write_bytes(text)
    before = peak_rss_mb()
    validates_or_refuses(path)
    assert peak_rss_mb() - before < 300


@st.composite
def overrides(draw):
    """KEY=VALUE words as typed after `porter validate R`: real and made-up keys,
    values from YAML snippets and arbitrary text."""
    data = SEED_DATA["wan-tiny-tp.yaml"]
    real = [".".join(map(str, path)) for path in paths(data) if path]
    words = []
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(real) | st.text(max_size=12)
                   | st.sampled_from(["a..b", ".", "model.family.x", "extends", "mesh.1",
                                      "generate.extra.__class__", "=", ""]))
        value = draw(st.sampled_from(SNIPPETS) | st.text(max_size=30)
                     | st.sampled_from([str(v) for v in NASTY_NUMBERS] + NASTY_STRINGS))
        words.append(f"{key}={value}")
    return words


@settings(HOSTILE, max_examples=60)
@given(words=overrides())
def test_hostile_overrides_through_porter_validate(words):
    validates_or_refuses(RECIPES / "wan-tiny-tp.yaml", *words)
