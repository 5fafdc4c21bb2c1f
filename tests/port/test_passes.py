"""The port's passes: one ordered table (``porter.port.passes``) that `validate`, `plan`, `run`,
the port's calls and `compile` all read. A probe pass added to the table is checked by
`validate`, fitted and listed by `plan`, applied in its place by a run and by `compile`,
and entered around each call and each denoising step of a run, in its place."""

import contextlib
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from porter import cli, registry as registry_mod, recipe
from porter.port import passes
from porter.transforms import Pass

from support import TINY_RECIPE


def test_the_table_holds_the_passes_in_the_order_a_run_applies_them():
    assert [step.name for step in passes.PASSES] == [
        "patches", "load", "setup", "scheduler", "lora", "dtypes",  # on the host
        "quantize", "placement", "rotary", "compile", "attention", "cache",  # on the mesh
        "encodings"]
    assert passes.PASSES == passes.HOST + passes.MESH
    for step in passes.PASSES:
        assert step.reads and step.does and (step.apply or step.abstract), step.name


@pytest.fixture
def probe(monkeypatch):
    """A pass after placement that records what each command asks of it, and refuses
    ``generate.seed`` 13 from the recipe alone and 14 against the model."""
    seen = []

    def check(c):
        seen.append("check")
        return [c.recipe.problem("generate.seed", "the probe refuses seed 13")] \
            if c.recipe.generate.seed == 13 else []

    def fit(c):
        seen.append(("fit", sorted(c.modules)))
        return [c.recipe.problem("generate.seed", "the probe refuses seed 14 for this "
                                 "model")] if c.recipe.generate.seed == 14 else []

    def apply(b):  # weights placed, nothing compiled yet
        seen.append(("apply", sorted(b.placement.reports), isinstance(b.pipe.transformer,
                                                          torch.nn.Module)))

    def abstract(b):
        seen.append(("abstract", sorted(b.placement.assignments), sorted(b.compile.rules)))

    @contextlib.contextmanager
    def entered(c):
        seen.append(("around", c.scope, c.step, c.call is not None))
        yield
        seen.append(("left", c.scope, c.step))

    def around(c):
        return entered(c)

    step = Pass("probe", ("generate.seed",), "records what is asked of it",
                each_call="records each call", check=check, fit=fit, apply=apply,
                abstract=abstract, detail=lambda c: "probing", around=around)
    after = [p.name for p in passes.MESH].index("placement") + 1
    mesh = (*passes.MESH[:after], step, *passes.MESH[after:])
    monkeypatch.setattr(passes, "MESH", mesh)
    monkeypatch.setattr(passes, "PASSES", passes.HOST + mesh)
    return seen


def test_validate_runs_every_pass_check_and_fit(probe, write, capsys):
    path = write("r.yaml", TINY_RECIPE)
    assert cli.main(["validate", str(path), "generate.seed=13"]) == 2
    assert "the probe refuses seed 13" in capsys.readouterr().err
    assert cli.main(["validate", str(path), "generate.seed=14"]) == 2
    assert "the probe refuses seed 14 for this model" in capsys.readouterr().err
    assert ("fit", ["text_encoder", "transformer", "vae"]) in probe
    assert cli.main(["validate", str(path)]) == 0


def test_plan_lists_the_passes_in_order_with_the_probe_in_its_place(probe, write, capsys):
    path = write("r.yaml", TINY_RECIPE)
    assert cli.main(["plan", str(path), "--devices", "8", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["passes"]
    assert [row["pass"] for row in rows] == [step.name for step in passes.PASSES]
    names = [row["pass"] for row in rows]
    assert names.index("probe") == names.index("placement") + 1
    assert rows[names.index("probe")] == {"pass": "probe", "reads": ["generate.seed"],
                       "does": "records what is asked of it", "applies": True,
                       "detail": "probing", "each_call": "records each call"}
    assert cli.main(["plan", str(path), "--devices", "8"]) == 0
    shown = capsys.readouterr().out
    assert "  probe      probing\n" in shown and "around each call: records each call" in shown
    assert cli.main(["plan", str(path), "--devices", "8", "generate.seed=14"]) == 2
    assert "the probe refuses seed 14 for this model" in capsys.readouterr().out


def test_a_run_applies_the_probe_after_placement_and_before_compile(probe, write,
                                                                    tmp_path):
    from porter import api

    port = api.load(write("r.yaml", TINY_RECIPE), "generate.steps=1",
                    f"output.dir={tmp_path / 'out'}")
    applied = [entry for entry in probe if entry[0] == "apply"]
    assert applied == [("apply", ["text_encoder", "transformer", "vae"], True)]
    assert port.generate().frames is not None
    calls = [entry for entry in probe if entry[0] in ("around", "left")]
    # the call's part around the whole generation; a step's inside it for each step
    assert calls == [("around", "call", None, True), ("around", "step", 0, True),
                     ("left", "step", 0), ("left", "call", None)]


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="compiling for a TPU needs libtpu: pip install -e '.[tpu]'")
def test_compile_applies_the_probes_abstract_part(probe, write):
    from porter.aot import port as abstract_port
    from porter.aot import targets

    loaded = recipe.load(write("r.yaml", TINY_RECIPE))
    built = abstract_port.build(loaded, registry_mod.loaded(), targets.named("v5e-8"))
    assert probe[-1] == ("abstract", ["text_encoder", "transformer", "vae"], [])
    assert set(built.components) == {"text_encoder", "transformer", "vae"}


def test_plan_shows_the_passes_from_a_fresh_process(write):
    path = write("r.yaml", TINY_RECIPE + "rotary: {precompute: false}\n")
    done = subprocess.run([sys.executable, "-m", "porter.cli", "plan", str(path),
                           "--devices", "8"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    listed = done.stdout.split("passes, in the order a run applies them (once; then around "
                               "each call):\n")[1].split("\n\n")[0]
    rows = [line for line in listed.splitlines() if "around each call:" not in line]
    assert [line.split()[0] for line in rows] == [step.name for step in passes.PASSES]
    assert "  rotary     -" in listed and "  load       tiny" in listed
    # what the patches do around each call, under their once; none for attention
    # without a backend
    assert listed.splitlines()[1].strip().startswith("around each call: the same patches")
    assert "around each call: the recipe's backend" not in listed


@pytest.mark.parametrize("precompute", [False, True])
def test_rotary_tables_only_where_the_recipe_asks(precompute, write):
    from porter import runtime
    from porter_wan.tiny import build_pipeline

    loaded = recipe.load(write("r.yaml", TINY_RECIPE), [f"rotary.precompute={precompute}"])
    pipe = build_pipeline()
    transformer = pipe.transformer  # the module itself (porting wraps it)
    passes.ported(pipe, loaded, registry_mod.loaded(), runtime.start(loaded))
    tables = [name for name, _ in transformer.named_buffers() if "porter_rotary" in name]
    assert bool(tables) == precompute


SCAN_FOR_META_GLOBALS = """
import sys, torch
from porter import registry as registry_mod, recipe
from porter.port import estimates
estimates.build(recipe.load(sys.argv[1]), registry_mod.loaded(), 8)
def tensors(value):
    # type(), not isinstance: a lazy module's placeholders import on attribute access
    if type(value) is dict:
        return [v for v in value.values() if type(v) is torch.Tensor]
    return [value] if type(value) is torch.Tensor else []
print(sorted(f"{name}.{attr}" for name, module in list(sys.modules.items())
             for attr, value in list(vars(module).items())
             if any(t.is_meta for t in tensors(value))))
"""


def test_a_plan_leaves_no_library_tensor_on_the_meta_device(write):
    """A tiny plan builds its pipeline on the meta device; the library modules it imports
    on the way (every diffusers autoencoder, among them the Cosmos VAE with its wavelets
    at module level) keep real tensors, so a later real load in the same process has
    their values. A fresh process: this one has imported them already."""
    path = write("r.yaml", TINY_RECIPE)
    cache = path.parent / "empty-cache"  # no kept sketch: the plan builds the model
    done = subprocess.run([sys.executable, "-c", SCAN_FOR_META_GLOBALS, str(path)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PORTER_CACHE_DIR": str(cache)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert list((cache / "sketches").glob("*.json"))  # it did build, and kept its sketch
