"""The original Wan release's own files as a recipe names them: its VAE
(``Wan2.1_VAE.pth``) as ``model.vae`` and its UMT5 encoder
(``models_t5_umt5-xxl-enc-bf16.pth``) as ``model.text_encoder``, PyTorch checkpoints
in the release's key names, located from their pickles without loading and read
tensor by tensor into their shards; a whole run from them; and the release's folder
itself as ``model.source``."""

import json

import numpy as np
import pytest
import torch
from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

from porter import registry as registry_mod, recipe, runtime
from porter.loading import pickled, single_file
from porter.loading.checkpoints import CorruptFile
from porter.port import passes
from porter.transforms.building import Building
from porter_wan import umt5

from support import RECIPES
from support.processes import porter_calls
from support.release_files import RELEASE_VAE, wan_umt5_names, wan_vae_names
from support.single_file import wan_names


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """A tiny Wan pipeline whose VAE has the release's layout, saved as diffusers saves
    it (``diffusers/``), and the same weights as the original release publishes them
    (``release/``): Wan's config.json, the transformer in Wan's names, the VAE and the
    text encoder as .pth files, the tokenizer in ``google/umt5-xxl``."""
    from diffusers import AutoencoderKLWan
    from porter_wan.tiny import TRANSFORMER, build_pipeline
    from safetensors.torch import save_file

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
    transformer = {k.removeprefix("model.diffusion_model."): v.contiguous() for k, v in
                   wan_names(pipe.transformer.state_dict()).items()}
    published = folder / "release"
    published.mkdir()
    torch.save(wan_vae_names(vae), published / "Wan2.1_VAE.pth")
    torch.save(wan_umt5_names(encoder), published / "models_t5_umt5-xxl-enc-bf16.pth")
    save_file(transformer, published / "diffusion_pytorch_model.safetensors")
    heads, head_dim = TRANSFORMER["num_attention_heads"], TRANSFORMER["attention_head_dim"]
    (published / "config.json").write_text(json.dumps({  # Wan's own keys
        "__name__": "Config", "_class_name": "WanModel", "_diffusers_version": "0.30.0",
        "dim": heads * head_dim, "eps": 1e-06, "ffn_dim": TRANSFORMER["ffn_dim"],
        "freq_dim": TRANSFORMER["freq_dim"], "in_dim": 16, "model_type": "t2v",
        "num_heads": heads, "num_layers": TRANSFORMER["num_layers"], "out_dim": 16,
        "text_len": 512}))
    pipe.tokenizer.save_pretrained(published / "google" / "umt5-xxl")
    return folder, {"vae": vae, "text_encoder": encoder}


def test_the_release_names_here_are_the_ones_the_converters_map(release):
    _, states = release
    assert sorted(convert_wan_vae_to_diffusers(wan_vae_names(states["vae"]))) == \
        sorted(states["vae"])
    assert sorted(umt5.from_wan_names(wan_umt5_names(states["text_encoder"]))) == \
        sorted(states["text_encoder"])


def test_a_tied_weight_is_read_under_either_name(release):
    """transformers saves UMT5's embedding once (``shared.weight``); the encoder holds it
    under two names: a file in transformers' names, as saved, is the encoder's."""
    from transformers import UMT5EncoderModel

    folder, _ = release
    encoder = UMT5EncoderModel.from_pretrained(folder / "diffusers" / "text_encoder")
    saved = next((folder / "diffusers" / "text_encoder").glob("*.safetensors"))
    assert "encoder.embed_tokens.weight" not in single_file.read_header(saved)
    assert single_file.problems(saved, encoder) == []


def test_a_checkpoint_is_located_from_its_pickle(release, tmp_path):
    folder, states = release
    entries = pickled.read_entries(folder / "release" / "Wan2.1_VAE.pth")
    raw = (folder / "release" / "Wan2.1_VAE.pth").read_bytes()
    name = "decoder.upsamples.4.shortcut.weight"  # any tensor: its bytes where it says
    entry = entries[name]
    value = torch.frombuffer(bytearray(raw[entry.offset:entry.offset + entry.nbytes]),
                             dtype=torch.float32).reshape(entry.shape)
    assert entry.dtype == "F32" and torch.equal(
        value, states["vae"]["decoder.up_blocks.1.resnets.0.conv_shortcut.weight"])
    base = torch.arange(12, dtype=torch.float32)
    torch.save({"a": base[2:6], "b": base[6:12].view(2, 3)}, tmp_path / "shared.pth")
    for name, entry in pickled.read_entries(tmp_path / "shared.pth").items():
        data = (tmp_path / "shared.pth").read_bytes()[entry.offset:entry.offset + entry.nbytes]
        want = base[2:6] if name == "a" else base[6:12].view(2, 3)
        assert torch.equal(torch.frombuffer(bytearray(data), dtype=torch.float32)
                           .reshape(entry.shape), want), name  # one storage, two offsets
    strided = {"w": torch.zeros(4, 4)[:, :2]}  # a view: its bytes are not its values
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
    registry = registry_mod.loaded()
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


def test_the_release_folder_is_a_source(release, tmp_path):
    """Fresh processes, as a user runs them: the release's folder as model.source
    validates, verifies, and runs (its scheduler set to the diffusers folder's, whose
    own is another), encoding and denoising exactly as the diffusers folder of the same
    weights; a folder lacking a file, a release of another model type, and one
    component's file given as another's are refused naming what is wrong."""
    from safetensors.torch import load_file

    folder, _ = release
    lacking = tmp_path / "lacking"
    lacking.mkdir()
    (lacking / "config.json").write_text((folder / "release" / "config.json").read_text())
    other = tmp_path / "i2v"
    other.mkdir()
    (other / "config.json").write_text(json.dumps(
        {**json.loads((folder / "release" / "config.json").read_text()), "model_type": "i2v"}))
    common = ["generate.frames=5", "generate.steps=2", "--no-progress"]
    same_scheduler = ["scheduler.name=FlowMatchEulerDiscreteScheduler",
                      "scheduler.config={shift: 7.0}"]
    validated, verified, plain, from_release, refused, other_kind, mixed_up = porter_calls(
        ["validate", RECIPES / "wan-tiny.yaml", f"model.source={folder / 'release'}"],
        ["verify", RECIPES / "wan-tiny.yaml", f"model.source={folder / 'release'}"],
        ["run", RECIPES / "wan-tiny.yaml", f"model.source={folder / 'diffusers'}",
         f"output.dir={tmp_path / 'a'}", *common],
        ["run", RECIPES / "wan-tiny.yaml", f"model.source={folder / 'release'}",
         *same_scheduler, f"output.dir={tmp_path / 'b'}", *common],
        ["validate", RECIPES / "wan-tiny.yaml", f"model.source={lacking}"],
        ["validate", RECIPES / "wan-tiny.yaml", f"model.source={other}"],
        ["validate", RECIPES / "wan-tiny.yaml", f"model.source={folder / 'diffusers'}",
         f"model.text_encoder={folder / 'release' / 'Wan2.1_VAE.pth'}"])
    for done in (validated, verified, plain, from_release):  # the layout holds no
        assert done.returncode == 0, done.stderr  # weights: each reads the release's
    assert "ok (wan" in validated.stdout
    for stage in ("encode", "denoise"):
        a, b = (load_file(tmp_path / run / f"{stage}.safetensors") for run in "ab")
        assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a), stage
    record = json.loads((tmp_path / "b" / "run.json").read_text())
    assert {"model.transformer", "model.vae", "model.text_encoder"} <= \
        set(record["checkpoint"]["files"])
    for done in (refused, other_kind, mixed_up):
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "model.text_encoder: " in mixed_up.stderr and "the model has no tensor" in \
        mixed_up.stderr  # a VAE's file given as the text encoder's
    assert "a Wan release folder without transformer, vae, text_encoder, " \
        "google/umt5-xxl" in refused.stderr
    assert "a Wan release of model_type 'i2v'" in other_kind.stderr


def test_a_transformer_in_shards_is_read_through_its_index(release, tmp_path):
    """The 14B release ships its transformer in shards with an index: the index is the
    file, its shards' headers read together."""
    from diffusers import WanTransformer3DModel
    from safetensors.torch import load_file, save_file

    folder, _ = release
    whole = load_file(folder / "release" / "diffusion_pytorch_model.safetensors")
    names = sorted(whole)
    halves = {"part-1.safetensors": names[::2], "part-2.safetensors": names[1::2]}
    for file, part in halves.items():
        save_file({name: whole[name] for name in part}, tmp_path / file)
    index = tmp_path / "diffusion_pytorch_model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {
        name: file for file, part in halves.items() for name in part}}))
    assert sorted(single_file.read_header(index)) == names
    model = WanTransformer3DModel.from_pretrained(folder / "diffusers" / "transformer")
    weights = single_file.located(index, model, single_file.converter_of(
        registry_mod.loaded().family("wan"), "transformer"))
    assert {entry.file.name for entry in weights.entries.values()} == set(halves)
    assert single_file.identity(index)["bytes"] == sum(
        (tmp_path / file).stat().st_size for file in halves)
