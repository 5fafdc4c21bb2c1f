"""Weights from the host (or a checkpoint) straight into their shards, one at a time;
what each device holds equals what `porter plan` says."""

import json
import threading
import time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from porter import loading, registry as registry_mod, recipe, runtime
from porter.loading import abstract, weights
from porter.port import estimates, passes
from porter.transforms.building import Building
from porter.port.passes import ported as port
from porter.shims import interop
from porter.transforms import placement

from support import RECIPES, TINY_RECIPE


def mesh_runtime(mesh: str = "{dp: 2, tp: 4}"):
    return runtime.start(recipe.load(RECIPES / "wan-tiny.yaml", [f"mesh={mesh}"]))


# --- one tensor -----------------------------------------------------------------------

SPECS = [(), ("tp",), (None, "tp"), (("dp", "tp"),), ("dp", "tp")]


@pytest.mark.parametrize("spec", SPECS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_place_gives_every_device_its_share(spec, dtype):
    from jax.sharding import NamedSharding

    from porter.transforms.sharding import partition_spec

    rt = mesh_runtime()
    host = (torch.arange(8 * 16).reshape(8, 16) % 7).to(dtype)
    sharding = NamedSharding(rt.mesh, partition_spec(spec))
    array = interop.place(interop.as_placed(host), (8, 16), sharding)
    assert array.sharding == sharding
    got = torch.from_numpy(np.asarray(array).astype(np.float32))
    assert torch.equal(got, host.float())
    assert array.dtype.itemsize == (4 if dtype == torch.int64 else host.element_size())
    for shard in array.addressable_shards:
        assert torch.equal(torch.from_numpy(np.asarray(shard.data).astype(np.float32)),
                           host.float()[shard.index])


def test_place_a_scalar():
    rt = mesh_runtime()
    array = interop.place(torch.tensor(2.5), (), rt.replicated())
    assert float(array) == 2.5 and len(array.sharding.device_set) == 8


def test_local_rows_span_what_this_process_holds():
    class Sharding:  # what a process whose devices hold rows 2:4 and 4:6 sees
        def addressable_devices_indices_map(self, shape):
            return {"a": (slice(2, 4), slice(None)), "b": (slice(4, 6), slice(None))}

    assert placement.local_rows((8, 3), Sharding()) == slice(2, 6)
    assert placement.local_rows((), Sharding()) == slice(None)


def test_reads_run_ahead_in_order_within_their_bounds(monkeypatch):
    monkeypatch.setattr(placement, "READ_AHEAD_BYTES", 250)
    sizes = [100, 100, 100, 300, 10, 10, 10, 10, 10]
    lock, in_flight, seen = threading.Lock(), set(), []

    def read(i):
        with lock:
            in_flight.add(i)
            seen.append((sorted(in_flight), sum(sizes[j] for j in in_flight)))
        time.sleep(0.01)
        with lock:
            in_flight.discard(i)
        return i * 2

    assert list(placement._read_ahead(sizes, read)) == [(i, i * 2) for i in range(len(sizes))]
    assert max(len(ids) for ids, _ in seen) <= placement.READ_AHEAD
    # over the byte bound only when one tensor alone is larger
    assert all(total <= 250 or len(ids) == 1 for ids, total in seen)


# --- a component ----------------------------------------------------------------------

def test_no_component_is_ever_moved_whole_to_jax(monkeypatch):
    """module.to("jax") puts a whole component on device 0 before any resharding."""
    from porter_wan.tiny import build_pipeline

    original = torch.nn.Module.to

    def refuse(self, *args, **kwargs):
        assert "jax" not in [str(a) for a in args] + [str(v) for v in kwargs.values()], \
            "a component was moved to JAX whole"
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", refuse)
    loaded = recipe.load(RECIPES / "wan-tiny-tp.yaml")
    rt = runtime.start(loaded)
    pipe = build_pipeline()
    port(pipe, loaded, registry_mod.loaded(), rt)
    q = pipe.transformer.module._model.blocks[0].attn1.to_q.weight.jax()
    assert q.addressable_shards[0].data.shape == (6, 24)


def test_tied_weights_stay_one_tensor():
    """UMT5's shared and encoder.embed_tokens weights are one tensor before and after."""
    from porter_wan.tiny import build_pipeline

    rt = mesh_runtime()
    encoder = build_pipeline().text_encoder
    assert encoder.shared.weight is encoder.encoder.embed_tokens.weight
    placement.apply(encoder, rt, [])
    assert encoder.shared.weight is encoder.encoder.embed_tokens.weight
    assert hasattr(encoder.shared.weight, "jax")


MESHES = [("wan-tiny-tp.yaml", []),
          ("wan-tiny-tp.yaml", ["mesh={dp: 1, tp: 8}", "generate.cfg_parallel=false"]),
          ("wan-tiny.yaml", ["mesh={dp: 8}"]),
          ("cogvideox-tiny.yaml", ["mesh={dp: 2, tp: 4}", "sharding.weights={transformer: "
                                   r"[{match: 'transformer_blocks\.\d+\.ff\.net\.0\.proj\."
                                   r"(weight|bias)', spec: [tp]}]}"]),
          ("hunyuan-tiny.yaml", ["mesh={tp: 8}", r"sharding.weights={transformer: [{match: "
                                 r"'.*\.ff\.net\.0\.proj\.weight', spec: [tp, null]}]}"]),
          # 8-bit weights with their scales split as their rows are
          ("wan-tiny-tp.yaml", ["quantize.format=int8"])]


@pytest.mark.parametrize("name,overrides", MESHES, ids=lambda v: str(v))
def test_devices_hold_what_plan_says(name, overrides):
    """After placement, each device's bytes (read from the arrays) equal the plan's
    per-device figure, component by component. Rotary tables cached afterwards are
    buffers the plan does not count; they are installed after this comparison."""
    loaded = recipe.load(RECIPES / name, overrides)
    registry = registry_mod.loaded()
    planned = {c["component"]: c["bytes_per_device"]
               for c in estimates.build(loaded, registry, devices=8)["components"]}
    rt = runtime.start(loaded)
    family = registry.family(loaded.model.family)
    building = Building(loaded, registry, family, rt)
    with building.stack:  # the patches, while the passes run
        ported = passes.build(building).ported()
    for component, report in ported.weights.items():
        assert report["planned_bytes_per_device"] == planned[component], component
        assert report["bytes_per_device"] == report["min_bytes_per_device"] \
            == planned[component], component
    assert any(c["bytes_per_device"] < c["bytes"] for c in ported.weights.values()) \
        or "dp: 8" in str(overrides)  # something is really split


# --- a checkpoint -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Wan pipeline (bfloat16, sharded files) as save_pretrained writes it."""
    from porter_wan.tiny import build_pipeline

    path = tmp_path_factory.mktemp("ckpt") / "wan"
    build_pipeline().to(torch.bfloat16).save_pretrained(path, max_shard_size="20KB")
    return path


def located(path, name):
    library, cls = abstract.module_classes(path)[name]
    module = abstract.empty_component(library, cls, path / name)
    return module, weights.for_module(module, path / name, library)


@pytest.mark.parametrize("name", ["transformer", "text_encoder", "vae"])
def test_every_tensor_is_found_in_the_files(saved, name):
    module, found = located(saved, name)
    assert found is not None
    assert set(found.entries) == set(module.state_dict())  # tied names included
    assert any(p.is_meta for p in module.parameters())
    files = {}
    for path in (saved / name).glob("*.safetensors"):
        files.update(load_file(path))
    for tensor_name, entry in found.entries.items():
        stored = files.get(tensor_name, files.get("shared.weight"))
        assert torch.equal(found.read(tensor_name, stored.dtype), stored)
        assert torch.equal(found.read(tensor_name, torch.float32), stored.float())
        if stored.dim() and stored.shape[0] > 2:
            assert torch.equal(found.read(tensor_name, stored.dtype, slice(1, 3)), stored[1:3])


def test_files_the_library_must_convert_are_left_to_it(saved, tmp_path):
    """A renamed or a missing tensor: only the library loader knows what to do."""
    import shutil

    for change in ("rename", "drop"):
        copy = tmp_path / change
        shutil.copytree(saved, copy)
        shard = sorted((copy / "vae").glob("*.safetensors"))[0]
        tensors = load_file(shard)
        key = sorted(tensors)[0]
        value = tensors.pop(key)
        if change == "rename":
            tensors["old_name." + key] = value
        save_file(tensors, shard)
        assert located(copy, "vae")[1] is None


def test_checkpoint_components_are_read_tensor_by_tensor(saved, write):
    """A local checkpoint: every component read from its files, none loaded whole on
    the host first, and the pipeline's other parts (tokenizer, scheduler) as saved."""
    path = write("r.yaml", TINY_RECIPE.replace(
        "source: tiny", f"source: {str(saved)!r}, dtype: bfloat16"))
    loaded = recipe.load(path)
    family = registry_mod.loaded().family("wan")
    found = loading.load_for_port(family, loaded)
    pipe, found = found.pipe, found.weights
    assert set(found) == {"transformer", "text_encoder", "vae"}
    assert all(p.is_meta for p in pipe.transformer.parameters())
    assert type(pipe.scheduler).__name__ == json.loads(
        (saved / "scheduler" / "scheduler_config.json").read_text())["_class_name"]
