"""Hostile recipes: whatever a recipe file holds, `porter validate` either accepts it
or refuses it with a UsageError (a RecipeError for the recipe itself, exit code 2);
never another exception, never a hang, never unbounded memory, never code run.

Property-based: valid seed recipes are mutated (types, keys, nesting, huge and
empty values, aliases) at the data level and at the text level (tags, alias
bombs, junk bytes, duplicated keys). Deterministic tests pin the known attacks.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from porter.port import checks

from porter.commands.validate import validate
from porter import cli, plugins, recipe
from porter.recipe import yamlio
from porter.errors import LoadError, RecipeError, UsageError

from conftest import RECIPES, ROOT, TINY_RECIPE

# ---------------------------------------------------------------- harness


class Hung(BaseException):
    """A BaseException, so that no ``except Exception`` in the code under test eats it."""


@contextlib.contextmanager
def within(seconds: float):
    """Fail (not hang) when the block runs longer than ``seconds``. SIGALRM also
    interrupts a blocking open() of a FIFO."""
    def expire(signum, frame):
        raise Hung(f"still running after {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def porter_validate(path, *overrides) -> int:
    """Exactly what `porter validate PATH [KEY=VALUE...]` runs, in this process."""
    args = cli.build_parser().parse_args(["validate", str(path), *overrides])
    return cli.SUBCOMMANDS["validate"].handle(args)


def validates_or_refuses(path, *overrides, seconds: float = 10.0):
    """Success, or a UsageError with exit code 2 that renders; anything else propagates.
    Returns the UsageError, or None on success."""
    try:
        with within(seconds):
            code = porter_validate(path, *overrides)
    except UsageError as exc:
        assert exc.exit_code == 2
        assert exc.render().startswith("error: ")
        return exc
    assert code in (0, 2)
    return None


def bounded_refusal(path, seconds: float, megabytes: float) -> str:
    """The RecipeError loading ``path`` raises, within a time and a memory bound
    (Python allocations at their peak, traced)."""
    tracemalloc.start()
    try:
        with within(seconds), pytest.raises(RecipeError) as info:
            recipe.load(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < megabytes * 2**20, f"{peak / 2**20:.0f} MiB"
    return info.value.render()


def refusal(path, *overrides, seconds: float = 10.0) -> str:
    """The rendered RecipeError that validating ``path`` must raise."""
    exc = validates_or_refuses(path, *overrides, seconds=seconds)
    assert isinstance(exc, RecipeError), f"{path} was not refused"
    return exc.render()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A folder with the hostile neighbours a recipe may point at."""
    root = tmp_path_factory.mktemp("hostile")
    (root / "base.yaml").write_text((RECIPES / "wan-base.yaml").read_text())
    os.mkfifo(root / "fifo")  # open() blocks until someone writes
    (root / "loop_a").symlink_to(root / "loop_b")
    (root / "loop_b").symlink_to(root / "loop_a")
    (root / "subdir").mkdir()
    return root


@pytest.fixture(scope="module", autouse=True)
def warm():
    """Start JAX (8 CPU devices, from conftest) and import the models once, so that
    time bounds measure validation, not first imports; and a hostile
    runtime.platform cannot change which platform JAX starts."""
    import jax

    assert jax.device_count() == 8
    for name in SEEDS:
        assert porter_validate(RECIPES / name) == 0


# ---------------------------------------------------------------- seeds and mutations


SEEDS = ("wan-tiny.yaml", "cogvideox-tiny.yaml", "hunyuan-tiny.yaml", "wan-tiny-tp.yaml",
         "wan14b.yaml", "bench/wan-block-2k.yaml")
# Full validation builds meta models for seeds with sharding rules; these are quick.
QUICK_SEEDS = ("wan-tiny.yaml", "cogvideox-tiny.yaml", "hunyuan-tiny.yaml",
               "wan-tiny-tp.yaml", "bench/wan-block-2k.yaml")


def seed_data(name: str) -> dict:
    """A shipped recipe as plain data, its extends already merged in."""
    data, _ = recipe._load_with_extends(RECIPES / name, ())
    return data


SEED_DATA = {name: seed_data(name) for name in SEEDS}

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


def nested(depth: int, kind: str):
    value: object = "leaf"
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


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


def paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from paths(value, prefix + (index,))


def get(data, path):
    for part in path:
        data = data[part]
    return data


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


def dump(data) -> str:
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)


# Reproducible (derandomize, no example database) and modest: the file runs in
# about a minute on a slow machine. No deadline: time is bounded by within().
HOSTILE = settings(deadline=None, derandomize=True, database=None, print_blob=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                          HealthCheck.filter_too_much,
                                          HealthCheck.large_base_example])


# ---------------------------------------------------------------- properties


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
            for problem in checks.recipe_problems(loaded, plugins.registry()):
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


BILLION_LAUGHS = "".join(
    ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n']
    + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)])

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


# ---------------------------------------------------------------- alias bombs and limits


BOMBS = {
    "list": BILLION_LAUGHS,
    "mapping": "a0: &a0 {x: 1, y: 2, z: 3, w: 4, v: 5, u: 6, t: 7, s: 8, r: 9}\n" + "".join(
        f"a{i}: &a{i} {{{', '.join(f'k{j}: *a{i - 1}' for j in range(9))}}}\n"
        for i in range(1, 10)),
    "one line": "x: [" + ", ".join(["&c0 [x, x, x, x, x, x, x, x, x, x]"] + [
        f"&c{i} [{', '.join([f'*c{i - 1}'] * 10)}]" for i in range(1, 10)]) + "]\n",
    "in a value": BILLION_LAUGHS + TINY_RECIPE.replace('prompt: "a cat"', "prompt: *l9"),
}


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
    assert "command line: generate.extra: override the document expands" in text


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


# ---------------------------------------------------------------- files and extends


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


@pytest.mark.parametrize("key,value,expected", [
    ("source", "x" * 300, "model.source: cannot look at this path: File name too long"),
    ("source", "~nosuchuser_porter/ckpt", "model.source: cannot expand '~nosuchuser_porter'"),
    ("source", "a\0b", "model.source: a path cannot contain a NUL character"),
    ("dir", "a\0b", "output.dir: a path cannot contain a NUL character"),
    ("compile_cache", "a\0b", "runtime.compile_cache: a path cannot contain a NUL"),
    ("image", "y" * 300, "generate.image: cannot look at this path: File name too long"),
    ("image", "~nosuchuser_porter/a.png", "generate.image: cannot expand"),
])
def test_hostile_paths_are_problems(write, key, value, expected):
    data = yaml.safe_load(TINY_RECIPE)
    section = {"source": "model", "dir": "output", "compile_cache": "runtime",
               "image": "generate"}[key]
    data.setdefault(section, {})[key] = value
    if key == "image":
        data["model"]["variant"] = "i2v"
    path = write("r.yaml", dump(data))
    exc = validates_or_refuses(path)
    problems = exc.problems if exc else validate(recipe.load(path),
                                                        plugins.registry())
    assert any(expected in problem.render() for problem in problems), problems


# ---------------------------------------------------------------- model.config


@pytest.mark.parametrize("config,expected", [
    ("{num_layers: abc}", "TypeError"),
    ("{num_attention_heads: -3}", "cannot be built"),
    ("{num_attention_heads: 100000000, attention_head_dim: 1000000}", "cannot be built"),
    ("{patch_size: {a: 1}}", "cannot be built"),
    ("{num_layers: 1000000000}", "too large to check"),
])
def test_model_config_problems_are_bounded(write, config, expected):
    path = write("r.yaml", TINY_RECIPE.replace("source: tiny}", f"source: tiny, config: "
                                               f"{config}}}"))
    loaded = recipe.load(path)
    with within(30):
        problems = validate(loaded, plugins.registry())
    assert [problem.path for problem in problems] == ["model.config"]
    assert expected in problems[0].message


def test_model_config_of_a_checkpoint_is_refused(write):
    """model.config shapes a tiny model only: on a hub id it would be silently ignored
    (a 40-block Wan 14B stays 40 blocks)."""
    path = write("r.yaml", TINY_RECIPE.replace(
        "source: tiny}", "source: Wan-AI/Wan2.1-T2V-14B-Diffusers, config: {num_layers: 1}}"))
    problems = validate(recipe.load(path), plugins.registry())
    assert [problem.path for problem in problems] == ["model.config"]
    assert "source: tiny" in problems[0].hint


@pytest.mark.parametrize("files,expected", [
    ({"model_index.json": "{"}, "JSONDecodeError"),
    ({"model_index.json": '["not", "a", "mapping"]'}, "cannot be built"),
    ({"model_index.json": '{"transformer": ["diffusers"]}'}, "IndexError"),
    ({"model_index.json": '{"transformer": ["diffusers", "WanTransformer3DModel"]}',
      "transformer/config.json": '{"num_layers": "abc"}'},
     "num_layers: 'abc' is a string where an integer belongs"),
    ({"model_index.json": '{"transformer": ["diffusers", "WanTransformer3DModel"]}',
      "transformer/config.json": '{"num_layers": 100000000}'}, "too large to check"),
])
def test_hostile_checkpoint_configs_are_problems(write, tmp_path, files, expected):
    """A local checkpoint's configuration files are input too: validate builds the
    model from them for the shape checks."""
    ckpt = tmp_path / "ckpt"
    for name, text in files.items():
        (ckpt / name).parent.mkdir(parents=True, exist_ok=True)
        (ckpt / name).write_text(text)
    data = copy.deepcopy(SEED_DATA["wan-tiny-tp.yaml"])  # it has sharding rules
    data["model"]["source"] = str(ckpt)
    loaded = recipe.load(write("r.yaml", dump(data)))
    with within(60):
        problems = validate(loaded, plugins.registry())
    assert [problem.path for problem in problems] == ["model.source"]
    assert expected in problems[0].message


# ---------------------------------------------------------------- no code runs


def payloads(marker: Path) -> list[str]:
    return [
        f'!!python/object/apply:os.mkdir ["{marker}"]',
        f'!!python/object/apply:os.system ["mkdir {marker}"]',
        f'!!python/object/new:subprocess.Popen [["mkdir", "{marker}"]]',
        f'!!python/object/apply:builtins.exec ["import os; os.mkdir(\'{marker}\')"]',
        "!!python/name:os.system",
        "!!python/module:os",
    ]


def test_python_tags_never_run(write, tmp_path):
    marker = tmp_path / "pwned"
    live = payloads(marker)[0]
    yaml.unsafe_load(live)  # control: this payload does run under an unsafe loader
    assert marker.exists()
    marker.rmdir()
    for index, payload in enumerate(payloads(marker)):
        places = {
            "top": payload + "\n",
            "value": TINY_RECIPE.replace("model: {family: wan, source: tiny}",
                                         f"model:\n  family: {payload}\n  source: tiny"),
            "key": TINY_RECIPE + f"? {payload}\n: 1\n",
            "extra": TINY_RECIPE.replace("steps: 3", f"steps: 3\n  extra:\n    a: {payload}"),
        }
        for place, text in places.items():
            rendered = refusal(write(f"r{index}-{place}.yaml", text))
            assert "is not allowed in a recipe" in rendered, rendered
        base = write(f"base{index}.yaml", places["value"])
        assert "is not allowed" in refusal(write(f"c{index}.yaml", f"extends: {base.name}\n"))
        override = refusal(write("o.yaml", TINY_RECIPE), f"generate.prompt={payload}")
        assert "command line: generate.prompt: override YAML tag" in override
    assert not marker.exists()


class ImportProbe:
    """A module that records being imported: recipes name it as if it were code."""

    NAME = "porter_hostile_probe"

    def __init__(self, folder: Path):
        self.marker = folder / "imported"
        (folder / f"{self.NAME}.py").write_text(
            f"open({str(self.marker)!r}, 'w').write('imported')\n"
            "def boom(*a, **k):\n    raise SystemExit('boom')\nclass Boom:\n    pass\n")

    def names(self) -> list[str]:
        return [self.NAME, f"{self.NAME}:boom", f"{self.NAME}.boom", f"{self.NAME}.Boom",
                f"{self.NAME}:Boom.__init__"]

    def untouched(self) -> bool:
        return not self.marker.exists() and self.NAME not in sys.modules


@pytest.fixture
def probe(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    return ImportProbe(tmp_path)


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    """A local 'checkpoint' with a model_index.json (no weights: nothing loads it here)."""
    path = tmp_path_factory.mktemp("ckpt") / "pipe"
    path.mkdir()
    (path / "model_index.json").write_text(
        '{"_class_name": "WanPipeline", "_diffusers_version": "0.35.0"}')
    return path


def generic_recipe(source: Path, pipeline: str | None) -> str:
    line = f"  pipeline: {pipeline!r}\n" if pipeline is not None else ""
    return (f"model:\n  family: generic\n  source: {str(source)!r}\n{line}"
            "generate: {prompt: a, height: 32, width: 32, frames: 9, steps: 2}\n")


@pytest.mark.parametrize("name", ["os.system", "subprocess.Popen", "builtins.eval",
                                  "diffusers.WanPipeline", "diffusers.pipelines.wan.WanPipeline",
                                  "porter_hostile_probe.Boom", "__class__", "__builtins__",
                                  "pipelines", "ModelMixin", "WanTransformer3DModel", ""])
def test_model_pipeline_resolves_only_diffusers_pipeline_names(write, probe, checkpoint_dir,
                                                                name):
    path = write("g.yaml", generic_recipe(checkpoint_dir, name))
    problems = validate(recipe.load(path), plugins.registry())
    assert [p.path for p in problems] == ["model.pipeline"]
    assert f"{name!r} is not a diffusers pipeline class" in problems[0].message
    assert probe.untouched()


def test_model_pipeline_accepts_a_diffusers_pipeline(write, checkpoint_dir):
    path = write("g.yaml", generic_recipe(checkpoint_dir, "WanPipeline"))
    assert validate(recipe.load(path), plugins.registry()) == []


def string_slots(data):
    """Every path in ``data`` that holds a string."""
    return [path for path in paths(data) if isinstance(get(data, path), str)]


def code_name_sections(name: str) -> list[dict]:
    """Recipe sections where a name of code could be smuggled in."""
    return [
        {"patches": [name, {"name": name, "params": {"target": name}}]},
        {"model": {"pipeline": name}},
        {"model": {"variant": name}},
        {"attention": {"backend": name, "skip": [name]}},
        {"compile": {name: {"methods": [name], "modules": name}}},
        {"dtypes": {"components": {name: "float32"}}},
        {"sharding": {"weights": {name: [{"match": name, "spec": [name]}]}}},
        {"generate": {"extra": {name: name}}},
        {"model": {"config": {name: name}}},
    ]


def test_no_recipe_string_imports_code(write, probe, checkpoint_dir):
    """Names of code anywhere in a recipe are data: looked up among what plugins
    registered (families, patches, attention) or in diffusers, never imported."""
    seeds = {name: SEED_DATA[name] for name in ("wan-tiny.yaml", "cogvideox-tiny.yaml",
                                                "hunyuan-tiny.yaml")}
    seeds["generic"] = yaml.safe_load(generic_recipe(checkpoint_dir, "WanPipeline"))
    cases = []
    for data in seeds.values():
        for name in probe.names():
            for slot in string_slots(data):
                case = copy.deepcopy(data)
                get(case, slot[:-1])[slot[-1]] = name
                cases.append(case)
            cases += [recipe._deep_merge(data, section) for section in code_name_sections(name)]
    for case in cases:
        validates_or_refuses(write("s.yaml", dump(case)))
    assert len(cases) > 200
    assert probe.untouched()


# ---------------------------------------------------------------- remote code


def test_no_source_enables_trust_remote_code():
    """Nothing in Porter or its plugins turns on remote code."""
    found = []
    for folder in (ROOT / "porter", ROOT / "plugins"):
        for file in folder.rglob("*.py"):
            for number, line in enumerate(file.read_text().splitlines(), 1):
                if "trust_remote_code" in line and "trust_remote_code=False" not in line:
                    found.append(f"{file.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []


class Captured(Exception):
    pass


@pytest.fixture
def no_header_check(monkeypatch):
    """Skip the weight-header check that may run before from_pretrained: these
    checkpoints have no weights, and the question here is what from_pretrained gets."""
    try:
        from porter.loading import checkpoints
    except ImportError:
        return
    monkeypatch.setattr(checkpoints, "check", lambda *args, **kwargs: None)


@pytest.mark.parametrize("family", ["wan", "cogvideox", "hunyuan", "generic"])
@pytest.mark.parametrize("kind", ["local", "hub"])
def test_loading_never_passes_trust_remote_code(write, monkeypatch, checkpoint_dir,
                                                no_header_check, family, kind):
    from porter import loading

    seen = []

    def capture(cls, *args, **kwargs):
        seen.append(kwargs)
        raise Captured

    source = str(checkpoint_dir) if kind == "local" else "some-org/some-model"
    path = write("r.yaml", TINY_RECIPE.replace("family: wan, source: tiny",
                                               f"family: {family}, source: {source!r}"))
    loaded = recipe.load(path)
    registered = plugins.registry().family(family)
    cls = registered.pipeline_class(loaded)
    monkeypatch.setattr(cls, "from_pretrained", classmethod(capture))
    monkeypatch.setattr(cls, "download", classmethod(capture))  # a hub id's snapshot
    with pytest.raises(Captured):
        loading.load_untouched(registered, loaded)
    [kwargs] = seen
    assert kwargs.get("trust_remote_code", False) is False
    assert not {"custom_pipeline", "custom_revision"} & set(kwargs)


def test_checkpoint_code_is_not_run(tmp_path, write, no_header_check):
    """A local checkpoint that ships Python (a custom pipeline and a custom component)
    fails to load with a LoadError; its code never runs."""
    from porter import loading

    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').write('ran')\n"
    ckpt = tmp_path / "ckpt"
    (ckpt / "transformer").mkdir(parents=True)
    (ckpt / "model_index.json").write_text(
        '{"_class_name": ["pipeline_evil", "EvilPipeline"], "_diffusers_version": "0.35.0",'
        ' "transformer": ["evil_component", "Evil"]}')
    (ckpt / "pipeline_evil.py").write_text(
        code + "from diffusers import DiffusionPipeline\n"
        "class EvilPipeline(DiffusionPipeline):\n    pass\n")
    (ckpt / "transformer" / "evil_component.py").write_text(code + "class Evil:\n    pass\n")
    (ckpt / "transformer" / "config.json").write_text("{}")
    path = write("r.yaml", TINY_RECIPE.replace("family: wan, source: tiny",
                                               f"family: generic, source: {str(ckpt)!r}"))
    loaded = recipe.load(path)
    with pytest.raises(LoadError) as info:
        loading.load_untouched(plugins.registry().family("generic"), loaded)
    assert "custom code" in str(info.value)
    assert not marker.exists()


# ---------------------------------------------------------------- the command line


def cli_cases(lab: Path) -> dict[str, str]:
    return {
        "alias bomb": BOMBS["in a value"],
        "python tag": '!!python/object/apply:os.system ["echo pwned"]\n',
        "custom tag": TINY_RECIPE.replace("family: wan", "family: !foo wan"),
        "extends /dev/zero": "extends: /dev/zero\n" + TINY_RECIPE,
        "extends fifo": f"extends: {lab / 'fifo'}\n" + TINY_RECIPE,
        "deep": TINY_RECIPE + "x: " + "[" * 500 + "]" * 500 + "\n",
        "huge int": TINY_RECIPE + "  seed: " + "9" * 5000 + "\n",
        "duplicate key": TINY_RECIPE + "generate: {}\n",
        "not a mapping": "- model\n- generate\n",
        "bad config": TINY_RECIPE.replace("source: tiny", "source: tiny, config: "
                                          "{num_layers: many}"),
    }


def test_cli_refuses_hostile_files_with_exit_2(capsys, lab):
    for name, text in cli_cases(lab).items():
        path = lab / "cli.yaml"
        path.write_text(text)
        with within(10):
            code = cli.main(["validate", str(path)])
        out, err = capsys.readouterr()
        assert code == 2, (name, out, err)
        assert "Traceback" not in out + err and "internal error" not in err, name
        assert err.startswith("error: ") and len(err.splitlines()) <= 4, (name, err)
        assert str(path) in err, name
