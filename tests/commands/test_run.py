"""End-to-end runs of the tiny Wan recipe, checked against PyTorch itself."""

import copy
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from porter import registry as registry_mod, recipe, runtime
from porter.commands.run import run
from porter.port.passes import ported as port
from porter.rundir import video

from support import RECIPES, TINY_RECIPE
from support.references import diffusers_latents

pytestmark = pytest.mark.slow

# Float32 on CPU: XLA and PyTorch order reductions differently, so results
# differ by rounding only; these bounds are a few hundred ulps of the values.
TRANSFORMER_RTOL = 1e-5
LATENTS_ATOL = 1e-4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    path = out / "tiny.yaml"
    path.write_text(TINY_RECIPE)
    loaded = recipe.load(path, [f"output.dir={out / 'result'}", "output.fps=7"])
    return loaded, run(loaded, registry_mod.loaded(), progress=False)


def test_tiny_run_writes_video_and_record(tiny):
    loaded, result = tiny
    frames, fps = video.read_mp4(result.video)
    assert frames.shape == (loaded.generate.frames, loaded.generate.height,
                            loaded.generate.width, 3)
    assert fps == 7
    # H.264 is lossy; the decoded video must still be the frames we wrote
    assert np.abs(frames.astype(int) - result.frames.astype(int)).mean() < 4
    data = json.loads(result.record.read_text())
    assert data["recipe_sha256"] == loaded.digest()
    assert data["recipe"]["generate"]["steps"] == 3
    assert data["seed"] == 0 and data["versions"]["torchax"]
    # what made the bytes: the array, file and video libraries, and the host CPU
    assert all(data["versions"][name] for name in ("numpy", "safetensors", "av"))
    assert data["device"].pop("host_cpu")
    assert data["device"] == {"platform": "cpu", "kind": "cpu", "count": 8, "processes": 1}
    assert data["mesh"] == {"dp": 8}
    timings = data["timings"]
    assert len(timings["steps_s"]) == 3
    assert {"load_s", "encode_s", "step_s", "decode_s", "write_s", "compile"} <= set(timings)
    assert timings["compile"]["seconds"] > 0
    # the prompt and the empty negative prompt, each encoded once
    assert timings["text_encoding"] == {"from_memory": 0, "encoded": 2}


def test_ported_transformer_matches_pytorch():
    from porter_wan.tiny import build_pipeline

    loaded = recipe.load(RECIPES / "wan-tiny.yaml")
    rt = runtime.start(loaded)
    pipe = build_pipeline().to(torch.float32)
    for module in pipe.components.values():
        if isinstance(module, torch.nn.Module):
            module.eval()
    reference = copy.deepcopy(pipe.transformer)
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, 3, 4, 4, generator=generator)
    t = torch.tensor([999.0, 250.0])
    text = torch.randn(2, 16, 32, generator=generator)
    with torch.no_grad():
        expected = reference(x, t, text, return_dict=False)[0]
    port(pipe, loaded, registry_mod.loaded(), rt)
    from porter.shims.interop import to_device, to_host
    with rt.env:
        got = pipe.transformer(to_device(x, rt), to_device(t, rt), to_device(text, rt),
                               return_dict=False)[0]
    got = to_host(got)
    relative = (got - expected).abs().max() / expected.abs().max()
    assert relative <= TRANSFORMER_RTOL, f"relative error {relative:.2e}"


def test_same_latents_as_plain_diffusers_pipeline(tiny):
    loaded, result = tiny
    expected = diffusers_latents(loaded)
    error = (result.latents - expected).abs().max().item()
    assert error <= LATENTS_ATOL, f"max abs error {error:.2e}"


def test_local_directory_source_loads_same_model(tiny, tmp_path):
    """save_pretrained + a recipe pointing at the folder: the real checkpoint path."""
    from porter_wan.tiny import build_pipeline

    loaded, result = tiny
    build_pipeline().save_pretrained(tmp_path / "ckpt")
    path = tmp_path / "local.yaml"
    path.write_text(TINY_RECIPE)
    local = recipe.load(path, [f"model.source={tmp_path / 'ckpt'}",
                               f"output.dir={tmp_path / 'out'}"])
    second = run(local, registry_mod.loaded(), progress=False)
    assert torch.equal(second.latents, result.latents)
    placed = second.data["weights"]["components"]
    assert {name: c["from"] for name, c in placed.items()} == {
        "transformer": "checkpoint", "text_encoder": "checkpoint", "vae": "checkpoint"}
    assert {c["from"] for c in result.data["weights"]["components"].values()} == {"host"}


def test_out_of_repo_family_runs_without_core_changes(tmp_path, monkeypatch):
    from support.plugins import EXTERNAL, make_dist

    make_dist(tmp_path, "ext_toy", EXTERNAL)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "toy.yaml"
    path.write_text(TINY_RECIPE.replace("family: wan", "family: toy"))
    loaded = recipe.load(path, [f"output.dir={tmp_path / 'out'}", "generate.steps=1"])
    result = run(loaded, registry_mod.load(), progress=False)
    assert result.video.exists() and result.data["recipe"]["model"]["family"] == "toy"
    sys.modules.pop("ext_toy", None)


def porter(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "porter.cli", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=300)


def test_second_identical_run_reuses_compile_cache(tmp_path):
    env = {**os.environ, "PORTER_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("XLA_FLAGS", None)
    recipe_file = tmp_path / "r.yaml"
    recipe_file.write_text(TINY_RECIPE)
    records, latents = [], []
    for _ in range(2):
        out = porter("run", str(recipe_file), f"output.dir={tmp_path / 'out'}",
                     "--no-progress", env=env)
        assert out.returncode == 0, out.stderr
        assert "wrote" in out.stdout and "Traceback" not in out.stderr
        records.append(json.loads((tmp_path / "out" / "run.json").read_text()))
        latents.append(load_file(str(tmp_path / "out" / "denoise.safetensors"))["latents"])
    first, second = (r["timings"]["compile"] for r in records)
    assert first["cache_misses"] > 0 and first["cache_hits"] == 0
    assert second["cache_misses"] == 0 and second["cache_hits"] >= first["cache_misses"]
    # the text encoder's and the transformer's forward, the VAE's streamed decode (its
    # first latent frame, the second, then every later one): traced once, then loaded
    assert (first["traces_saved"], first["traces_loaded"]) == (5, 0)
    assert (second["traces_saved"], second["traces_loaded"]) == (0, 5)
    assert torch.equal(latents[0], latents[1])  # the stored program computes the same
    assert second["seconds"] < first["seconds"]
    assert records[0]["recipe_sha256"] == records[1]["recipe_sha256"]
    # another prompt, seed and output directory: the same programs, still loaded
    other = porter("run", str(recipe_file), f"output.dir={tmp_path / 'other'}",
                   "generate.prompt=a different prompt", "generate.seed=7", "--no-progress",
                   env=env)
    assert other.returncode == 0, other.stderr
    third = json.loads((tmp_path / "other" / "run.json").read_text())["timings"]["compile"]
    assert (third["traces_saved"], third["traces_loaded"]) == (0, 5)


def test_cfg_parallel_gives_the_same_latents(tmp_path):
    """One batch of [cond, uncond] or two passes: the same video."""
    path = tmp_path / "r.yaml"
    path.write_text(TINY_RECIPE)
    latents = []
    for flag in ("true", "false"):
        loaded = recipe.load(path, [f"generate.cfg_parallel={flag}", "generate.steps=2",
                                    f"output.dir={tmp_path / flag}", "mesh.dp=2"])
        latents.append(run(loaded, registry_mod.loaded(), progress=False).latents)
    assert (latents[0] - latents[1]).abs().max() <= 1e-5
