"""Sketches (``porter.transforms.sketch``) and their copies kept on disk
(``porter.loading.kept_sketches``): what the checks read of a model equals what they
would read of the built modules, and a kept copy is used only for the same model."""

from __future__ import annotations

import pytest
import torch
from support import RECIPES

from porter import recipe as recipe_mod
from porter.loading import abstract, kept_sketches
from porter.registry import loaded as registry
from porter.transforms import quantize, sketch


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache of Porter's own."""
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "sketches"


def _load(name, *overrides):
    loaded = recipe_mod.load(RECIPES / name, list(overrides))
    return loaded, registry().family(loaded.model.family)


def _fields(found: dict) -> dict:
    """Everything a sketch holds but its module (which a kept one builds on demand)."""
    return {name: s.to_json() for name, s in found.items()}


MIXED = ("model.dtype=bfloat16", "dtypes.components={vae: float32}",
         "dtypes.overrides={transformer: [{match: '.*norm.*', dtype: float32}, "
         "{match: 'blocks\\.0\\..*', dtype: float16}]}")


@pytest.mark.parametrize("name,overrides", [
    ("wan-tiny.yaml", MIXED), ("hunyuan15-tiny.yaml", ()), ("wan22-i2v-tiny.yaml", ())])
def test_a_kept_sketch_reads_as_the_modules_it_was_made_of(name, overrides, cache):
    """Built, then read back from disk: both equal the sketch of the modules as a run
    holds them (the recipe's dtypes cast in torch), overrides and float32 islands
    included."""
    loaded, family = _load(name, *overrides)
    built = abstract.sketches(family, loaded)
    assert len(list(cache.iterdir())) == 1
    kept = abstract.sketches(family, loaded)
    modules = abstract.components(family, loaded)
    assert _fields(built) == _fields(kept) == _fields(
        {n: sketch.of(m) for n, m in modules.items()})
    # a kept sketch gives its module when a check needs it (built on the meta device)
    assert type(kept["transformer"].torch()).__name__ == kept["transformer"].class_name


def test_quantized_sketches_lay_out_what_quantize_makes(cache):
    """``quantize.sketched`` (the plan's and the memory check's bytes) holds the
    tensors ``quantize.quantized`` makes of the same layers."""
    loaded, family = _load("wan-tiny.yaml", "quantize.format=fp8", *MIXED)
    sketches = quantize.sketched(loaded, family, abstract.sketches(family, loaded))
    modules = abstract.components(family, loaded)
    transformer = modules["transformer"]
    names = quantize.chosen(loaded, family, sketch.of(transformer))
    assert names  # the blocks' linear layers
    quantize.quantized(transformer, names, quantize.FORMATS["fp8"])
    assert sketches["transformer"].tensors == sketch.of(transformer).tensors
    assert sketches["transformer"].tensors[f"{names[0]}.weight"].dtype == "float8_e4m3fn"


def test_the_key_follows_what_the_build_reads(tmp_path):
    """Another configuration, layout or input is another model; a prompt, a size, a
    dtype or a mesh is the same one."""
    loaded, family = _load("wan-tiny.yaml")
    key = kept_sketches.key(family, loaded)
    for same in ("generate.prompt=a cat", "generate.height=32", "model.dtype=bfloat16",
                 "mesh.tp=2", "quantize.format=int8"):
        assert kept_sketches.key(family, _load("wan-tiny.yaml", same)[0]) == key, same
    for other in ("model.config={num_layers: 3}", "model.variant=ti2v"):
        assert kept_sketches.key(family, _load("wan-tiny.yaml", other)[0]) != key, other
    image = _load("wan22-i2v-tiny.yaml")[0]
    assert kept_sketches.key(family, image) != kept_sketches.key(
        family, image.model_copy(update={"generate": image.generate.model_copy(
            update={"image": None})}))
    # the code that builds: any source file of the package changed
    (tmp_path / "a.py").write_text("x = 1\n")
    stamp = kept_sketches._stamp.__wrapped__(tmp_path)  # the digest (a process takes it once)
    (tmp_path / "a.py").write_text("x = 10\n")
    assert kept_sketches._stamp.__wrapped__(tmp_path) != stamp


def test_a_local_checkpoints_key_follows_its_configuration_files(saved_tiny, tmp_path):
    """A local checkpoint's key reads its configuration files, not its path alone."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(saved_tiny, copy)
    loaded, family = _load("wan-tiny.yaml", f"model.source={copy}")
    key = kept_sketches.key(family, loaded)
    config = copy / "transformer" / "config.json"
    config.write_text(config.read_text().replace('"num_layers": 2', '"num_layers": 3'))
    assert kept_sketches.key(family, loaded) != key


@pytest.mark.parametrize("damage", ["{not json", "[]", '{"transformer": {}}'])
def test_an_unreadable_kept_sketch_is_built_again(damage, cache):
    loaded, family = _load("wan-tiny.yaml")
    abstract.sketches(family, loaded)
    [kept] = cache.iterdir()
    kept.write_text(damage)
    again = abstract.sketches(family, loaded)
    assert again["transformer"].class_name == "WanTransformer3DModel"
    assert kept_sketches.read(kept.stem) is not None  # and kept again


def test_the_oldest_kept_sketches_go_past_the_bound(cache, monkeypatch):
    import os
    import time

    monkeypatch.setattr(kept_sketches, "KEPT", 2)
    cache.mkdir(parents=True)
    for index, name in enumerate(("a", "b", "c")):
        (cache / f"{name}.json").write_text("{}")
        os.utime(cache / f"{name}.json", (time.time() - 100 + index,) * 2)
    dead = cache / f".x.json.1-ab{kept_sketches.atomic.PARTIAL}"
    dead.write_text("")
    os.utime(dead, (time.time() - 2 * kept_sketches.STALE_S,) * 2)
    kept_sketches.keep("d", {})
    assert sorted(p.name for p in cache.iterdir()) == ["c.json", "d.json"]


def test_a_tied_linear_weight_is_untied_by_quantize_as_in_a_run(cache):
    """A language model's output layer shares its embedding's weight: the sketch holds
    the tensor once, under its first name, and the quantized layout gives the layer 8-bit
    values of its own, as ``quantize.quantized`` does to the module."""
    class Tied(torch.nn.Module):
        def __init__(self, head_first: bool):
            super().__init__()
            if head_first:  # the layer's name comes first: the embedding is the alias
                self.head = torch.nn.Linear(4, 10, bias=False)
            self.embed = torch.nn.Embedding(10, 4)
            if not head_first:
                self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

    loaded, family = _load("wan-tiny.yaml", "quantize.format=int8",
                           "quantize.include=['head']", "quantize.components=[encoder]")
    for head_first, aliases in ((False, {"head.weight": "embed.weight"}),
                                (True, {"embed.weight": "head.weight"})):
        module = Tied(head_first)
        found = sketch.of(module)
        assert found.aliases == aliases and len(found.tensors) == 1
        [laid_out] = quantize.sketched(loaded, family, {"encoder": found}).values()
        quantize.quantized(module, ["head"], quantize.FORMATS["int8"])
        assert laid_out.tensors == sketch.of(module).tensors, head_first
        assert laid_out.aliases == {}


def test_a_sketch_answers_the_fits_questions():
    """Methods and their signatures (as bound), linear layers, block lists, submodules
    and the configuration by key and by attribute."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def enable_tiling(self, tile: int = 8, *, overlap=None):
            pass

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(), Block()])
            self.register_buffer("table", torch.zeros(3, dtype=torch.float64))
            self.config = {"num_layers": 2, "patch_size": (1, 2, 2), "sub": {"width": 4}}

    found = sketch.of(Model())
    # what a run can call: methods, submodules, __call__ (not a property's value)
    assert found.has_method("blocks") and found.has_method("__call__")
    assert not found.has_method("training")
    assert found.linears == ("blocks.0.proj", "blocks.1.proj")
    assert found.blocks == (("blocks", 2),)
    assert "blocks.1.proj" in found.submodules and found.has_method("forward")
    assert found.tensors["table"] == sketch.Tensor((3,), "float64")
    assert found.config.patch_size == [1, 2, 2] and found.config["sub"].width == 4
    block = sketch.of(Block())
    block.signature("enable_tiling").bind(tile=4, overlap=2)
    with pytest.raises(TypeError):
        block.signature("enable_tiling").bind(size=4)
    assert sketch.Sketch.from_json(found.to_json()).to_json() == found.to_json()
    # transformers' other names for a key are read as its configuration object reads them
    from transformers import UMT5Config

    assert sketch._plain_config(UMT5Config(d_model=32)).hidden_size == 32
