"""Compile boundaries without hand-written rules: non-tensor arguments are static,
and what cannot be traced whole is split into the largest pieces that trace."""

import torch

from porter import recipe, runtime
from porter.recipe.schema import CompileRule
from porter.transforms import jit
from porter.transforms import placement
from porter.transforms.jit.traces import TraceCache

from support import RECIPES


class Untraceable(torch.nn.Module):
    """A block whose forward branches on a tensor's value (as Mochi's attention does
    with ``torch.nonzero``): no trace can take it whole."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(8, 8)
        self.outer = torch.nn.Linear(8, 8)
        self.act = torch.nn.GELU()  # no weights: runs eagerly inside its parent

    def forward(self, x):
        x = self.act(self.inner(x))
        if x.sum() > 0:  # needs the value
            x = x * 2
        return self.outer(x)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(4, 8)
        self.blocks = torch.nn.ModuleList([Untraceable(), torch.nn.Linear(8, 8)])
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x, repeats: int = 1, twice: bool = False, return_dict: bool = True):
        x = self.embed(x)
        for _ in range(repeats):  # a Python int: fine once it is static
            for block in self.blocks:
                x = block(x)
        x = self.head(x)
        return (x * 2 if twice else x,)


def _rt():
    return runtime.start(recipe.load(RECIPES / "wan-tiny.yaml", ["mesh.dp=8"]))


def _ported(rt, traces=None):
    torch.manual_seed(0)
    model = Model().eval()
    expected = model(torch.ones(2, 4), repeats=2, twice=True)[0]
    placement.apply(model, rt, [])
    splits = {}
    compiled = jit.apply(model, CompileRule(methods=["forward"],
                                                          static_argnames=[]),
                                       traces, "model", splits=splits)
    return compiled, splits["model"], expected


def test_untraceable_module_is_split_into_compiled_pieces():
    from porter.shims.interop import to_device, to_host

    rt = _rt()
    compiled, split, expected = _ported(rt)
    with rt.env:
        got = compiled(to_device(torch.ones(2, 4), rt), repeats=2, twice=True)[0]
    torch.testing.assert_close(to_host(got), expected)
    assert set(split.eager) == {"", "blocks.0"}
    assert all("ConcretizationTypeError" in why or "TracerBoolConversionError" in why
               for why in split.eager.values())
    # the largest pieces that trace: everything with weights outside the bad block,
    # the bad block's own children
    assert split.compiled == {"embed", "blocks.1", "head", "blocks.0.inner",
                              "blocks.0.outer"}
    assert split.report() == {"eager": split.eager, "compiled": sorted(split.compiled)}


def test_non_tensor_arguments_are_static_without_a_rule():
    """``repeats`` drives a Python loop and ``twice`` a branch: both must be static,
    and the recipe's static_argnames is empty."""
    from porter.shims.interop import to_device, to_host

    rt = _rt()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8)).eval()

    class Loop(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = model

        def forward(self, x, repeats, twice=False):
            for _ in range(repeats):
                x = x + self.body(x).sum(-1, keepdim=True)
            return x * 2 if twice else x

    loop = Loop()
    expected = loop(torch.ones(2, 4), 3, twice=True)
    placement.apply(loop, rt, [])
    splits = {}
    compiled = jit.apply(loop, CompileRule(methods=["forward"],
                                                         static_argnames=[]),
                                       None, "loop", splits=splits)
    with rt.env:
        got = compiled(to_device(torch.ones(2, 4), rt), 3, twice=True)  # positional too
    torch.testing.assert_close(to_host(got), expected)
    assert splits["loop"].report() is None  # traced whole


def test_the_split_is_remembered(tmp_path, monkeypatch):
    """A second run with the same trace cache goes straight to the split: the
    component is never traced whole again."""
    from porter.shims.interop import to_device
    from porter.transforms.jit import autosplit

    rt = _rt()
    traces = TraceCache(tmp_path, "fingerprint")
    compiled, split, _ = _ported(rt, traces)
    with rt.env:
        compiled(to_device(torch.ones(2, 4), rt), repeats=2, twice=True)
    assert traces.split_store("model").exists()

    failures = []
    monkeypatch.setattr(autosplit.Split, "failed",
                        lambda self, path, exc: failures.append(path))
    compiled, again, _ = _ported(rt, TraceCache(tmp_path, "fingerprint"))
    assert set(again.eager) == {"", "blocks.0"}
    with rt.env:
        compiled(to_device(torch.ones(2, 4), rt), repeats=2, twice=True)
    assert failures == []  # nothing traced and failed this time
    assert again.compiled == split.compiled


class TwoWays(torch.nn.Module):
    """A VAE's shape: an encode that branches on a value, a decode that traces."""

    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(4, 4)
        self.decoder = torch.nn.Linear(4, 4)

    def _encode(self, x):
        x = self.encoder(x)
        return x * 2 if x.sum() > 0 else x  # needs the value

    def decode(self, z):
        return self.decoder(self.encoder(z))


def test_each_method_is_split_by_itself():
    """An untraceable ``_encode`` runs eagerly (its children compiled) and leaves
    ``decode`` one program, traced whole after the split as before it."""
    from porter.shims.interop import to_device, to_host

    rt = _rt()
    torch.manual_seed(0)
    model = TwoWays().eval()
    x = torch.ones(2, 4)
    expected = model._encode(x), model.decode(x), model.decode(torch.ones(3, 4))
    placement.apply(model, rt, [])
    splits = {}
    compiled = jit.apply(model, CompileRule(methods=["decode", "_encode"]), None, "vae",
                         splits=splits)
    with rt.env:
        decoded = compiled.decode(to_device(x, rt))
        encoded = compiled._encode(to_device(x, rt))
        again = compiled.decode(to_device(torch.ones(3, 4), rt))  # a new shape: traced
    for got, want in zip((encoded, decoded, again), expected):
        torch.testing.assert_close(to_host(got), want)
    assert set(splits["vae"].eager) == {"_encode()"}
    assert {"decode()", "encoder", "decoder"} <= splits["vae"].compiled
