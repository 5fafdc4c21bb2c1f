"""The original Wan release's own files as a recipe names them: its VAE
(``Wan2.1_VAE.pth``) as ``model.vae`` and its UMT5 encoder
(``models_t5_umt5-xxl-enc-bf16.pth``) as ``model.text_encoder``, PyTorch checkpoints
in the release's key names, located from their pickles without loading and read
tensor by tensor into their shards; and a whole run from them."""

import json

import numpy as np
import pytest
import torch
from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

from porter import plugins, recipe, runtime
from porter.loading import pickled
from porter.loading.checkpoints import CorruptFile
from porter.port import passes
from porter.port.building import Building
from porter_wan import umt5

from support import RECIPES
from support.processes import porter_calls
from support.release_files import RELEASE_VAE, wan_umt5_names, wan_vae_names


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """A tiny Wan pipeline whose VAE has the release's layout, saved as diffusers saves
    it, and its VAE and text encoder saved again as the release's .pth files."""
    from diffusers import AutoencoderKLWan
    from porter_wan.tiny import build_pipeline

    folder = tmp_path_factory.mktemp("release")
    pipe = build_pipeline()
    torch.manual_seed(1)
    pipe.vae = AutoencoderKLWan(**RELEASE_VAE).eval()
    pipe.register_modules(vae=pipe.vae)
    pipe.save_pretrained(folder / "diffusers")
    # as the pipeline holds them (float32), so that a run from these files and a run
    # from the folder start from the same values
    vae = {k: v.contiguous() for k, v in pipe.vae.state_dict().items()}
    encoder = {k: v.contiguous() for k, v in pipe.text_encoder.state_dict().items()}
    torch.save(wan_vae_names(vae), folder / "Wan2.1_VAE.pth")
    torch.save(wan_umt5_names(encoder), folder / "models_t5_umt5-xxl-enc-bf16.pth")
    return folder, {"vae": vae, "text_encoder": encoder}


def test_the_release_names_here_are_the_ones_the_converters_map(release):
    _, states = release
    assert sorted(convert_wan_vae_to_diffusers(wan_vae_names(states["vae"]))) == \
        sorted(states["vae"])
    assert sorted(umt5.from_wan_names(wan_umt5_names(states["text_encoder"]))) == \
        sorted(states["text_encoder"])


def test_a_checkpoint_is_located_from_its_pickle(release, tmp_path):
    folder, states = release
    entries = pickled.read_entries(folder / "Wan2.1_VAE.pth")
    raw = (folder / "Wan2.1_VAE.pth").read_bytes()
    name = "decoder.upsamples.4.shortcut.weight"  # any tensor: its bytes where it says
    entry = entries[name]
    value = torch.frombuffer(bytearray(raw[entry.offset:entry.offset + entry.nbytes]),
                             dtype=torch.float32).reshape(entry.shape)
    assert entry.dtype == "F32" and torch.equal(
        value, states["vae"]["decoder.up_blocks.1.resnets.0.conv_shortcut.weight"])
    strided = {"w": torch.zeros(4, 4)[:, :2]}  # a view: its bytes are not its values'
    torch.save(strided, tmp_path / "strided.pth")
    with pytest.raises(CorruptFile, match="stored strided"):
        pickled.read_entries(tmp_path / "strided.pth")
    torch.save({"config": {"dim": 4}}, tmp_path / "config.pth")
    with pytest.raises(CorruptFile, match="not tensors"):
        pickled.read_entries(tmp_path / "config.pth")


def test_each_file_gives_its_component_its_values(release, tmp_path):
    """Read into shards on a dp=2 x tp=4 mesh: each tensor the file's value (files
    whose values differ from model.source's: the files win), in the recipe's dtype."""
    folder, states = release
    states = {name: {k: v * 2 for k, v in state.items()} for name, state in states.items()}
    torch.save(wan_vae_names(states["vae"]), tmp_path / "vae.pth")
    torch.save(wan_umt5_names(states["text_encoder"]), tmp_path / "umt5.pth")
    loaded = recipe.load(RECIPES / "wan-tiny-tp.yaml", [
        f"model.source={folder / 'diffusers'}", "model.dtype=bfloat16",
        f"model.vae={tmp_path / 'vae.pth'}", f"model.text_encoder={tmp_path / 'umt5.pth'}"])
    registry = plugins.registry()
    building = Building(loaded, registry, registry.family("wan"), runtime.start(loaded))
    with building.stack:
        built = passes.build(building)
        for name in ("vae", "text_encoder"):
            assert built.placement.reports[name]["from"] == "checkpoint", name
            held = dict(built.modules[name].state_dict())
            for key, value in states[name].items():
                got = np.asarray(held[key].jax()).astype(np.float32)
                want = value.to(held[key].dtype).float().numpy()  # the recipe's dtype
                assert np.array_equal(got, want), (name, key)
        files = built.ported().checkpoint["files"]
    assert {"model.vae", "model.text_encoder"} <= set(files)


def test_as_a_user_runs_it(release, tmp_path):
    """Fresh processes: a run from the release's files encodes and denoises exactly as
    a run from the diffusers folder does (the same weights, the same seed); a file of
    another component is refused by `porter validate`, naming tensors that do not fit."""
    from safetensors.torch import load_file

    folder, _ = release
    source = f"model.source={folder / 'diffusers'}"
    files = [f"model.vae={folder / 'Wan2.1_VAE.pth'}",
             f"model.text_encoder={folder / 'models_t5_umt5-xxl-enc-bf16.pth'}"]
    common = ["generate.frames=5", "generate.steps=2", "--no-progress"]
    refused, plain, from_files = porter_calls(
        ["validate", RECIPES / "wan-tiny.yaml",
         f"model.text_encoder={folder / 'Wan2.1_VAE.pth'}"],
        ["run", RECIPES / "wan-tiny.yaml", source, f"output.dir={tmp_path / 'a'}", *common],
        ["run", RECIPES / "wan-tiny.yaml", source, *files, f"output.dir={tmp_path / 'b'}",
         *common])
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "model.text_encoder: " in refused.stderr and "the model has no tensor" in \
        refused.stderr
    assert plain.returncode == 0, plain.stderr
    assert from_files.returncode == 0, from_files.stderr
    record = json.loads((tmp_path / "b" / "run.json").read_text())
    assert {"model.vae", "model.text_encoder"} <= set(record["checkpoint"]["files"])
    for stage in ("encode", "denoise"):
        a, b = (load_file(tmp_path / run / f"{stage}.safetensors") for run in "ab")
        assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a), stage
    assert (tmp_path / "b" / "video.mp4").stat().st_size > 0
