"""A call that takes an object it writes (a key/value cache) and sizes made on the host
(a grid read with ``.item()``) is compiled whole: the object goes in as its tensors
and comes back written, the sizes as constants (porter.transforms.jit.lifting)."""

import contextlib
from dataclasses import dataclass

import pytest
import torch

from porter import recipe, runtime
from porter.recipe.schema import CompileRule
from porter.transforms import jit, placement
from porter.transforms.jit import lifting
from porter.transforms.jit.traces import TraceCache

from support import RECIPES


class LayerCache:
    def __init__(self):
        self.key = None


class Cache:
    """Wan-Animate-2's shape: one slot a layer, None until the reference pass."""

    def __init__(self, layers: int):
        self.layers = [LayerCache() for _ in range(layers)]


class Referenced(torch.nn.Module):
    """A reference pass that stores each layer's keys, a step that reads them; both read
    the reference grid's sizes (``.item()``), make a grid of their own from shapes
    (``.tolist()``) and keep a table made on the host, moved to the device, for the
    next call, as Wan-Animate-2's transformer does."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))
        self.tables = {}

    def forward(self, x, cache, mode: str, grid=None, area=None):
        offset = grid[0][1].item()  # a number, not a value inside the program
        own = torch.stack([torch.tensor(x.shape)]).tolist()[0]
        if offset not in self.tables:  # kept across calls, and programs
            self.tables[offset] = torch.full((4,), 0.5).to(x.device)
        x = x + self.tables[offset]
        scale = area[0] * area[1] / 16 if area is not None else 1.0
        for layer, slot in zip(self.layers, cache.layers):
            key = layer(x)
            if mode == "extract":
                slot.key = key
            else:
                x = x + slot.key[:, : own[1]] * scale
        return x * offset


def _rt():
    return runtime.start(recipe.load(RECIPES / "wan-tiny.yaml", ["mesh.dp=8"]))


X, GRID = torch.ones(2, 4), torch.tensor([[1, 3, 5]])


def _segment(call, cache, x=X):
    call(x, cache, "extract", grid=GRID)
    return call(x, cache, "cached", grid=GRID, area=[4, 8])


def _compiled(rt, traces=None):
    """(the compiled model, its split, its output and cache run as PyTorch runs it)."""
    torch.manual_seed(0)
    model = Referenced().eval()
    cache = Cache(2)
    with torch.no_grad():
        expected = _segment(model, cache)
    model.tables.clear()  # made on the host's device: the compiled call makes its own
    placement.apply(model, rt, [])
    splits = {}
    compiled = jit.apply(model, CompileRule(methods=["forward"]), traces, "model",
                         splits=splits)
    return compiled, splits["model"], expected, cache


def test_a_call_that_writes_its_cache_and_reads_its_grid_compiles_whole(tmp_path):
    from porter.shims.interop import to_device, to_host

    rt = _rt()
    compiled, split, expected, expected_cache = _compiled(
        rt, TraceCache(tmp_path, "fingerprint"))
    with _counted() as traced, rt.env:
        caches = [Cache(2), Cache(2)]
        got = [_segment(compiled, cache, to_device(X, rt)) for cache in caches]
    for out, cache in zip(got, caches):
        torch.testing.assert_close(to_host(out), expected)
        for slot, want in zip(cache.layers, expected_cache.layers):  # written back
            torch.testing.assert_close(to_host(slot.key), want.key)
    assert split.eager == {} and split.report()["sized"] == [""]
    with rt.env:  # a step reads the cache: its slots are not copied out and back
        keys = [slot.key for slot in caches[0].layers]
        compiled(to_device(X, rt), caches[0], "cached", grid=GRID, area=[4, 8])
    assert all(slot.key is key for slot, key in zip(caches[0].layers, keys))
    # the reference pass fails on .item() (traced twice: the trace cache tries to export
    # it first), then each pass traces once with its sizes as constants; the second
    # segment's new cache (same structure) and grid (same values) reuse both programs
    assert len(traced) == 4
    assert '"sized": [""]' in traces_text(tmp_path)


def traces_text(directory):
    return next(directory.glob("*.split.json")).read_text()


def test_what_traced_with_its_sizes_is_remembered(tmp_path):
    """A second run goes straight to the sizes: its programs come from the trace cache,
    nothing is traced (a plain trace, as a forgotten split would try, fails again)."""
    from porter.shims.interop import to_device

    rt = _rt()
    compiled, *_ = _compiled(rt, TraceCache(tmp_path, "fingerprint"))
    with rt.env:
        _segment(compiled, Cache(2), to_device(X, rt))
    compiled, split, *_ = _compiled(rt, TraceCache(tmp_path, "fingerprint"))
    assert split.sized == {""}
    with _counted() as traced, rt.env:
        _segment(compiled, Cache(2), to_device(X, rt))
    assert traced == [] and split.eager == {}


@contextlib.contextmanager
def _counted():
    """Each trace of Referenced's forward, in a list."""
    traced, original = [], Referenced.forward
    Referenced.forward = lambda *a, **k: (traced.append(1), original(*a, **k))[1]
    try:
        yield traced
    finally:
        Referenced.forward = original


@pytest.mark.parametrize("value, expected", [
    (torch.tensor([[1, 3, 5]]), True), ([4, 8], True),
    ([], False), ([4, 8.0], False), (torch.arange(17), False), (torch.ones(3), False),
])
def test_sizes_are_few_integers_made_on_the_host(value, expected):
    assert lifting.is_sizes(value) is expected


def test_sizes_reach_the_model_as_they_were_given():
    """A list as a list; a tensor as a host tensor of its dtype and shape, which PyTorch
    computes with while the call is traced."""
    grid = torch.tensor([[1, 3, 5]])
    given = lifting.as_sizes({"grid": grid, "area": [4, 8], "x": torch.ones(2)})
    assert given["area"] == lifting.Sizes((4, 8)) and given["x"].shape == (2,)
    hash(given["grid"])  # a static argument
    again = given["grid"].given()
    assert type(again) is torch.Tensor and again.dtype == torch.int64
    assert torch.equal(again, grid) and given["area"].given() == [4, 8]


@dataclass
class Settings:
    scale: torch.Tensor | None = None


class Config:
    def __init__(self):
        self.layers = 2


@pytest.mark.parametrize("value, expected", [
    (Cache(2), True), (LayerCache(), True),
    (Config(), False),  # numbers: static, as before
    (Settings(), False),  # compared by value: static
    (torch.nn.Linear(2, 2), False), (torch.ones(2), False), ([None], False),
    (Cache(0), False),  # no slot
])
def test_only_objects_holding_tensors_alone_are_state(value, expected):
    assert lifting.is_state(value) is expected


def test_a_call_that_changes_its_state_s_structure_is_split():
    """Only slots come back out of a program: a call that adds to its object runs
    eagerly, its children compiled, and the object is written as the model wrote it."""
    from porter.shims.interop import to_device

    class Grows(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 4)

        def forward(self, x, cache):
            cache.layers.append(LayerCache())
            cache.layers[-1].key = self.layer(x)
            return x

    rt = _rt()
    model = Grows().eval()
    placement.apply(model, rt, [])
    splits = {}
    compiled = jit.apply(model, CompileRule(methods=["forward"]), None, "grows",
                         splits=splits)
    cache = Cache(1)
    with rt.env:
        compiled(to_device(torch.ones(2, 4), rt), cache)
    assert "StateChanged" in splits["grows"].eager[""]
    assert len(cache.layers) == 2 and cache.layers[1].key is not None


class Pair:
    def __init__(self, key=None):
        self.kv = (key, None)


class Writes(torch.nn.Module):
    """A cache written in place (a preallocated slot), and a tuple of slots replaced."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)

    def forward(self, x, buffer, pair):
        buffer.layers[0].key.copy_(self.layer(x))  # the same tensor, another array
        pair.kv = (pair.kv[0], self.layer(x) * 2)  # a new tuple
        return x


def test_slots_written_in_place_or_in_a_new_tuple_come_back():
    from porter.shims.interop import to_device, to_host

    rt = _rt()
    torch.manual_seed(0)
    model = Writes().eval()
    expected = model.layer(X)
    placement.apply(model, rt, [])
    splits = {}
    compiled = jit.apply(model, CompileRule(methods=["forward"]), None, "writes",
                         splits=splits)
    buffer, pair = Cache(1), Pair()
    with rt.env:
        buffer.layers[0].key = to_device(torch.zeros(2, 4), rt)
        pair.kv = (to_device(torch.ones(1), rt), None)
        first = pair.kv[0]
        compiled(to_device(X, rt), buffer, pair)
    assert splits["writes"].report() is None  # compiled whole
    torch.testing.assert_close(to_host(buffer.layers[0].key), expected)
    assert type(pair.kv) is tuple and pair.kv[0] is first  # read, kept
    torch.testing.assert_close(to_host(pair.kv[1]), expected * 2)


class Mixed(torch.nn.Module):
    """Needs its grid's value, then multiplies a device tensor by the host grid: traced
    with the grid as sizes, a host tensor meets a device one; it splits and runs."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 3)

    def forward(self, x, grid):
        if grid[0][0].item() > 0:
            x = x * 2
        return self.layer(x) * grid


def test_a_call_that_fails_with_its_sizes_splits_as_before():
    from porter.shims.interop import to_device, to_host

    rt = _rt()
    torch.manual_seed(0)
    model = Mixed().eval()
    grid = torch.tensor([[1, 2, 3]])
    expected = model(torch.ones(2, 3), grid)
    placement.apply(model, rt, [])
    splits = {}
    compiled = jit.apply(model, CompileRule(methods=["forward"]), None, "mixed",
                         splits=splits)
    with rt.env:
        got = compiled(to_device(torch.ones(2, 3), rt), grid)
    torch.testing.assert_close(to_host(got), expected)
    assert "ConcretizationTypeError" in splits["mixed"].eager[""]
    assert splits["mixed"].sized == set()


def test_host_moves_nest():
    """A sized call traced inside another leaves the outer one's moves kept."""
    from porter.shims.compat import import_torchax

    env = import_torchax().default_env()
    with lifting.host_moves_kept():
        outer = env._to_copy
        with lifting.host_moves_kept():
            assert env._to_copy is not outer
        assert env._to_copy is outer
    assert "_to_copy" not in vars(env)
