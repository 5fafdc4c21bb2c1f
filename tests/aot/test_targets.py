"""TPU slices as Cloud TPU names them, what a machine without libtpu is told, and what
libtpu is started with."""

import json
from importlib import metadata

import pytest

from porter.aot import targets
from porter.errors import UsageError

from support import RECIPES
from support.aot import needs_libtpu
from support.processes import user_porter


def test_targets_as_tpu_users_name_them():
    assert targets.named("v5litepod-8") is targets.named("v5e-8")
    for name, chips in (("v4-8", 4), ("v5e-8", 8), ("v5p-8", 4), ("v6e-8", 8),
                        ("v5e-16", 16), ("v6e-16", 16), ("v7x-8", 8), ("v7x-16", 16),
                        ("v5p-32", 16), ("v5p-64", 32)):
        target = targets.named(name)
        assert target.chips == chips and target.facts.source.startswith("https://")
    with pytest.raises(UsageError, match="unknown target 'v6e-9'") as refused:
        targets.named("v6e-9")
    assert "did you mean 'v6e-8'" in refused.value.hint
    # another name of a listed slice, suggested with the name the list gives it
    with pytest.raises(UsageError) as refused:
        targets.named("tpu")
    assert "did you mean 'tpu7x-8' (v7x-8)?" in refused.value.hint
    assert targets.named("tpu7x-8") is targets.named("v7x-8")


def test_each_chip_runs_matmuls_at_its_published_peak_for_their_operands():
    """The roofline counts an int8 matmul at v6e's int8 rate and an fp8 one at TPU7x's
    fp8 rate; a kind without a faster published peak runs at bfloat16's (v4's int8,
    v6e's fp8). Per JAX device: a TPU7x chip is two."""
    from porter.aot import roofline

    v4, v6e, v7x = (targets.named(n).facts for n in ("v4-8", "v6e-8", "v7x-8"))
    assert v6e.peak("int8") == 2 * v6e.peak("bf16") == 2 * v6e.peak("fp8")
    assert v7x.peak("fp8") == 2 * v7x.peak("bf16") == 2307e12
    assert v4.peak("int8") == v4.peak("bf16") and v4.faster == set()
    assert v7x.hbm_bytes == 96 * 2**30  # half of a chip's 192 GiB
    # 10 TFLOP of int8 matmuls and 1 TFLOP of other work, on a v6e
    assert roofline.compute_seconds(11e12, {"int8": 10e12}, v6e) == \
        10e12 / 1836e12 + 1e12 / 918e12
    # the rest never goes below zero where XLA counts fewer FLOPs than the matmuls
    assert roofline.compute_seconds(1e12, {"bf16": 2e12}, v6e) == 2e12 / 918e12


def test_without_libtpu_compile_says_what_to_install(monkeypatch):
    from porter.errors import UsageError

    monkeypatch.setattr(targets, "libtpu_missing", lambda: "libtpu is not installed")
    with pytest.raises(UsageError) as info:
        targets.devices(targets.named("v6e-8"))
    installed = [r for r in metadata.requires("porter") if r.startswith("libtpu")]
    assert [r.split(";")[0] for r in installed] == [targets.libtpu_requirement()]
    assert f"pip install '{targets.libtpu_requirement()}'" in info.value.hint
    assert targets.libtpu_requirement().startswith("libtpu==")  # the tpu extra's pin


@needs_libtpu
def test_a_mesh_larger_than_the_target_is_refused():
    out = user_porter("compile", str(RECIPES / "wan14b.yaml"), "--target", "v5p-8")
    assert out.returncode == 2
    assert "needs 8 devices but v5p-8 has 4 chips" in out.stderr


@needs_libtpu
def test_a_mesh_that_splits_an_axis_of_the_torus_is_refused_naming_it():
    """v5p-64 is a 4x4x2 torus: dp=2 x ring=2 x sp=8 would cut one of its 4s in two;
    dp=2 x ring=4 x sp=4 spans whole axes."""
    target = targets.named("v5p-64")
    with pytest.raises(UsageError) as refused:
        targets.mesh(target, {"dp": 2, "ring": 2, "sp": 8})
    assert refused.value.message == ("mesh dp=2 x ring=2 x sp=8 does not fit v5p-64's "
                                     "torus (4x4x2): each mesh axis must span whole axes "
                                     "of it")
    assert targets.mesh(target, {"dp": 2, "ring": 4, "sp": 4}).devices.shape == (2, 4, 4)


@needs_libtpu
@pytest.mark.slow
def test_umt5_xxl_compiles_for_v7x_where_its_lowering_overflowed_libtpus_stack(tmp_path):
    """Wan's text encoder, UMT5-XXL, ended the compile for v7x-8 with a stack overflow
    in libtpu's lowering (a signal, no message); two of its 24 layers suffice. Porter
    gives libtpu's fibers a larger stack. As a user runs it, in a fresh process; a
    weightless Wan folder with the published encoder's width (about a minute)."""
    import shutil

    from porter.loading import published

    parts = published.FOLDER / "Wan-AI--Wan2.2-Animate-2-14B-Diffusers"
    for part in ("text_encoder", "tokenizer", "vae", "scheduler"):
        shutil.copytree(parts / part, tmp_path / part)
    encoder = json.loads((tmp_path / "text_encoder" / "config.json").read_text())
    assert encoder["d_model"] == 4096 and encoder["num_layers"] == 24  # UMT5-XXL
    encoder["num_layers"] = 2
    (tmp_path / "text_encoder" / "config.json").write_text(json.dumps(encoder))
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text(json.dumps({
        "_class_name": "WanTransformer3DModel", "num_layers": 1,
        "num_attention_heads": 2, "attention_head_dim": 64, "ffn_dim": 256}))
    (tmp_path / "model_index.json").write_text(json.dumps({
        "_class_name": "WanPipeline", "scheduler": ["diffusers", "DPMSolverMultistepScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"]}))
    out = user_porter("compile", str(RECIPES / "wan14b.yaml"), "--target", "v7x-8",
                      "--program", "text_encoder.forward", f"model.source={tmp_path}",
                      "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    [row] = json.loads(out.stdout)["programs"]
    assert row["program"] == "text_encoder.forward"
    assert row["status"] == "compiled" and row["fits"]
