"""The hostile-input harness: validate in this process within a time bound, refused or
accepted, never anything else; the seed recipes mutations start from."""

from __future__ import annotations

import contextlib
import resource
import signal
import tracemalloc

import pytest
import yaml

from porter import cli, recipe
from porter.errors import RecipeError, UsageError

from support import RECIPES, TINY_RECIPE


class Hung(BaseException):
    """A BaseException, so that no ``except Exception`` in the code under test eats it."""


@contextlib.contextmanager
def within(seconds: float):
    """Fail (not hang) when the block runs longer than ``seconds``. SIGALRM also
    interrupts a blocking open() of a FIFO. This timer stands in for pytest-timeout's
    (the same signal) for the rest of the test."""
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


def nested(depth: int, kind: str):
    value: object = "leaf"
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


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


def dump(data) -> str:
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)


BILLION_LAUGHS = "".join(
    ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n']
    + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)])


BOMBS = {
    "list": BILLION_LAUGHS,
    "mapping": "a0: &a0 {x: 1, y: 2, z: 3, w: 4, v: 5, u: 6, t: 7, s: 8, r: 9}\n" + "".join(
        f"a{i}: &a{i} {{{', '.join(f'k{j}: *a{i - 1}' for j in range(9))}}}\n"
        for i in range(1, 10)),
    "one line": "x: [" + ", ".join(["&c0 [x, x, x, x, x, x, x, x, x, x]"] + [
        f"&c{i} [{', '.join([f'*c{i - 1}'] * 10)}]" for i in range(1, 10)]) + "]\n",
    "in a value": BILLION_LAUGHS + TINY_RECIPE.replace('prompt: "a cat"', "prompt: *l9"),
}
