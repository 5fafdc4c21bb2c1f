"""Bad checkpoints and stage artifacts are found from file headers, before any weight
is loaded or anything compiles, and named: file, tensor, expected and found."""

import json
import shutil
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from porter import cli, recipe
from porter.errors import LoadError, UsageError
from porter.loading import checkpoints
from porter.rundir import artifacts

from support import TINY_RECIPE

TRANSFORMER = "transformer/diffusion_pytorch_model.safetensors"
TENSOR = "proj_out.weight"  # a tiny Wan transformer parameter: [64, 24] float32


def _wan(**kwargs):
    from porter_wan.tiny import build_pipeline
    return build_pipeline(**kwargs)


def _cogvideox():
    from porter_cogvideox.tiny import build_pipeline
    return build_pipeline()


def _hunyuan():
    from porter_hunyuan.tiny import build_pipeline
    return build_pipeline()


def _hunyuan15():
    from porter_hunyuan.tiny import build_pipeline_15
    return build_pipeline_15()


@pytest.fixture(scope="module")
def wan_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "wan"
    _wan().save_pretrained(path)
    return path


@pytest.fixture
def bad(wan_dir, tmp_path):
    """A private copy of the tiny Wan checkpoint, to corrupt."""
    return shutil.copytree(wan_dir, tmp_path / "wan")


def problems_of(path) -> str:
    with pytest.raises(LoadError) as info:
        checkpoints.check(path)
    assert "re-save the pipeline with save_pretrained" in info.value.hint
    return info.value.message


def rewrite(path, change):
    """Load a safetensors file, let ``change`` edit its dict of tensors, save it back."""
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path)


# --- valid checkpoints: no false alarms -------------------------------------------

VALID = {
    "wan": lambda path: _wan().save_pretrained(path),
    "wan-two-experts": lambda path: _wan(experts=2).save_pretrained(path),
    "wan-bfloat16": lambda path: _wan().to(torch.bfloat16).save_pretrained(path),
    "wan-sharded": lambda path: _wan().save_pretrained(path, max_shard_size="20KB"),
    "cogvideox": lambda path: _cogvideox().save_pretrained(path),
    "hunyuan": lambda path: _hunyuan().save_pretrained(path),
    "hunyuan15": lambda path: _hunyuan15().save_pretrained(path),
}


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_checkpoints_have_no_problems(name, tmp_path):
    """Tied T5/UMT5 embeddings (shared.weight saved once), float32 buffers, bfloat16
    files, sharded indexes: all as save_pretrained writes them, and none flagged."""
    VALID[name](tmp_path / name)
    assert checkpoints.directory_problems(tmp_path / name) == []
    checkpoints.check(tmp_path / name)


def test_text_encoder_saved_from_a_head_model_is_valid(tmp_path):
    """transformers loads a LlamaForCausalLM file ('model.' keys, lm_head) into the
    LlamaModel a pipeline names: the check strips the prefix as it does."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path / "hunyuan"
    _hunyuan().save_pretrained(path)
    config = LlamaConfig.from_pretrained(path / "text_encoder")
    shutil.rmtree(path / "text_encoder")
    LlamaForCausalLM(config).save_pretrained(path / "text_encoder")
    assert checkpoints.directory_problems(path) == []


def test_weights_that_are_not_safetensors_are_left_to_the_loader(tmp_path):
    """.bin files are pickles: never opened here (the loader uses weights_only)."""
    path = tmp_path / "wan"
    _wan().save_pretrained(path, safe_serialization=False)
    assert checkpoints.directory_problems(path) == []


# --- missing files -----------------------------------------------------------------

def test_missing_weight_file(bad):
    (bad / TRANSFORMER).unlink()
    message = problems_of(bad)
    assert "1 problem " in message
    assert f"transformer: {bad / 'transformer'}: no weight file" in message
    assert "diffusion_pytorch_model.safetensors" in message


def test_missing_config(bad):
    (bad / "vae" / "config.json").unlink()
    assert f"vae: {bad / 'vae' / 'config.json'} is missing" in problems_of(bad)


def test_unreadable_model_index(bad):
    (bad / "model_index.json").write_text("{")
    assert f"model_index.json: {bad / 'model_index.json'} is not valid JSON" in \
        problems_of(bad)


def test_index_naming_a_missing_shard(tmp_path):
    path = tmp_path / "wan"
    _wan().save_pretrained(path, max_shard_size="20KB")
    index = json.loads((path / "transformer/diffusion_pytorch_model.safetensors.index.json")
                       .read_text())
    shard = sorted(set(index["weight_map"].values()))[1]
    (path / "transformer" / shard).unlink()
    message = problems_of(path)
    # one problem: the shard, not every tensor it held
    assert "1 problem " in message and f"shard {shard} is missing" in message


# --- truncated or corrupt files ----------------------------------------------------

def test_truncated_tail_says_bytes_expected_and_present(bad):
    file = bad / TRANSFORMER
    data = file.read_bytes()
    file.write_bytes(data[:-100])
    message = problems_of(bad)
    assert (f"{file}: truncated: {len(data)} bytes expected, {len(data) - 100} present "
            "(100 missing)") in message


def test_truncated_inside_the_header(bad):
    file = bad / TRANSFORMER
    data = file.read_bytes()
    header = int.from_bytes(data[:8], "little")
    file.write_bytes(data[:8 + header // 2])
    message = problems_of(bad)
    assert (f"{file}: truncated inside its header: {8 + header} bytes of header expected, "
            f"{8 + header // 2} present") in message


def test_not_a_safetensors_file(bad):
    (bad / TRANSFORMER).write_bytes(b"<html>404 Not Found</html>")  # a failed download
    assert "header" in problems_of(bad)


def test_safetensors_refuses_a_truncated_tail_too(bad):
    """The check does not rely on it, but safetensors' own loader would fail later,
    without the sizes: the early check loses nothing that worked."""
    from safetensors import SafetensorError

    file = bad / TRANSFORMER
    file.write_bytes(file.read_bytes()[:-100])
    with pytest.raises(SafetensorError):
        load_file(file)


# --- wrong tensors -----------------------------------------------------------------

def test_wrong_shape_names_tensor_file_expected_and_found(bad):
    file = bad / TRANSFORMER
    rewrite(file, lambda t: t.update({TENSOR: torch.zeros(64, 12)}))
    assert (f"transformer: {file}: tensor '{TENSOR}' has shape [64, 12], the model "
            "expects [64, 24]") in problems_of(bad)


def test_integer_tensor_for_a_float_parameter(bad):
    """Casting to the recipe's dtype would turn integers into 'weights' silently:
    floating parameters need floating tensors (any width: the loader casts those)."""
    file = bad / TRANSFORMER
    rewrite(file, lambda t: t.update({TENSOR: t[TENSOR].to(torch.int32)}))
    assert (f"{file}: tensor '{TENSOR}' has dtype I32, the model expects a "
            "floating-point float32") in problems_of(bad)


def test_dtype_torch_cannot_load(bad):
    file = bad / TRANSFORMER
    data = file.read_bytes()
    # a dtype name this torch does not know, same length so the header still fits
    entry = data.index(b'"' + TENSOR.encode() + b'":{"dtype":"F32"')
    at = entry + len(TENSOR) + len('"":{"dtype":"')
    file.write_bytes(data[:at] + b"Q32" + data[at + 3:])
    assert f"tensor '{TENSOR}' has dtype Q32, which this torch cannot load" in problems_of(bad)


def test_tensor_missing_from_the_file(bad):
    file = bad / TRANSFORMER
    rewrite(file, lambda t: t.pop(TENSOR))
    assert (f"transformer: {bad / 'transformer'}: tensor '{TENSOR}' ([64, 24]) is in no "
            "weight file") in problems_of(bad)


def test_tied_embedding_missing_under_both_names(bad):
    rewrite(bad / "text_encoder/model.safetensors", lambda t: t.pop("shared.weight"))
    message = problems_of(bad)
    assert "1 problem " in message and "tensor 'shared.weight' ([384, 32])" in message


def test_every_problem_in_one_error_first_ones_shown(bad):
    names = sorted(load_file(bad / TRANSFORMER))[:15]
    rewrite(bad / TRANSFORMER, lambda t: [t.pop(n) for n in names])
    (bad / "vae/diffusion_pytorch_model.safetensors").write_bytes(b"")
    message = problems_of(bad)
    assert message.startswith(f"{bad}: 16 problems in the weight files")
    assert f"... and {16 - checkpoints.SHOWN} more" in message


# --- end to end: the run stops before loading or compiling -------------------------

def test_run_on_a_corrupt_checkpoint_exits_2_before_loading(bad, write, tmp_path, capsys,
                                                           monkeypatch):
    from porter import loading
    from porter.port import passes

    calls = []
    monkeypatch.setattr(loading, "from_pretrained", lambda *a: calls.append("load"))
    monkeypatch.setattr(passes, "port", lambda *a: calls.append("port"))
    rewrite(bad / TRANSFORMER, lambda t: t.update({TENSOR: torch.zeros(64, 12)}))
    path = write("r.yaml", TINY_RECIPE)
    start = time.perf_counter()
    code = cli.main(["run", str(path), f"model.source={bad}", f"output.dir={tmp_path / 'o'}",
                     "--no-progress"])
    seconds = time.perf_counter() - start
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"tensor '{TENSOR}' has shape [64, 12], the model expects [64, 24]" in err
    assert "hint: re-download transformer" in err
    assert calls == []  # no weight loaded, nothing ported or compiled
    assert seconds < 60, seconds


# --- stage artifacts ----------------------------------------------------------------

@pytest.fixture
def stage(write, tmp_path):
    """A saved denoise stage (latents [1, 16, 3, 4, 4] float32) and its recipe."""
    loaded = recipe.load(write("r.yaml", TINY_RECIPE), [f"output.dir={tmp_path / 'run'}"])
    directory = tmp_path / "run"
    artifacts.save(directory, "denoise", {"latents": torch.randn(1, 16, 3, 4, 4)}, loaded)
    return directory, loaded


def refused(directory, loaded) -> UsageError:
    with pytest.raises(UsageError) as info:
        artifacts.check(directory, "denoise", loaded)  # what a run calls before starting
    with pytest.raises(UsageError):
        artifacts.load(directory, "denoise", loaded)
    assert info.value.hint
    return info.value


def test_intact_stage_loads(stage):
    directory, loaded = stage
    assert artifacts.load(directory, "denoise", loaded)["latents"].shape == (1, 16, 3, 4, 4)


def test_truncated_stage_file(stage):
    directory, loaded = stage
    file = directory / "denoise.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[:-10])
    error = refused(directory, loaded)
    assert error.message == (f"{file}: cannot be read: truncated: {len(data)} bytes "
                             f"expected, {len(data) - 10} present (10 missing)")
    assert "run it again" in error.hint


def test_stage_tensor_of_another_dtype(stage):
    directory, loaded = stage
    rewrite(directory / "denoise.safetensors",
            lambda t: t.update(latents=t["latents"].to(torch.float64)))
    assert ("tensor 'latents' has dtype torch.float64, its record says torch.float32"
            in refused(directory, loaded).message)


def test_stage_tensor_of_another_shape(stage):
    directory, loaded = stage
    rewrite(directory / "denoise.safetensors", lambda t: t.update(latents=torch.zeros(2)))
    assert ("tensor 'latents' is [2], its record says [1, 16, 3, 4, 4]"
            in refused(directory, loaded).message)


@pytest.mark.parametrize("text", ["{not json", "[]", '{"stage": "denoise"}',
                                  '{"settings": {}, "tensors": {"latents": {}}}'])
def test_stage_record_that_is_not_a_record(stage, text):
    directory, loaded = stage
    (directory / "denoise.json").write_text(text)
    error = refused(directory, loaded)
    assert str(directory / "denoise.json") in error.message


def test_stage_record_without_its_tensors_file(stage):
    directory, loaded = stage
    (directory / "denoise.safetensors").unlink()
    error = refused(directory, loaded)
    assert f"{directory / 'denoise.safetensors'} is missing" in error.message
    assert "--stage denoise" in error.hint


def test_decode_on_a_truncated_stage_exits_2_before_loading(stage, write, capsys,
                                                           monkeypatch):
    from porter import loading

    directory, _ = stage
    monkeypatch.setattr(loading, "load_pipeline", lambda *a: pytest.fail("loaded weights"))
    file = directory / "denoise.safetensors"
    file.write_bytes(file.read_bytes()[:-10])
    code = cli.main(["run", str(write("r.yaml", TINY_RECIPE)), f"output.dir={directory}",
                     "--stage", "decode", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "truncated" in err and "10 missing" in err


def test_validate_reports_weight_file_problems(bad, tmp_path, capsys):
    """`porter validate` reads the same headers: a truncated file fails validation."""
    path = bad / TRANSFORMER
    path.write_bytes(path.read_bytes()[:-100])
    recipe_file = tmp_path / "r.yaml"
    recipe_file.write_text(f"model: {{family: wan, source: {bad}}}\n"
                           "generate: {prompt: a, height: 32, width: 32, frames: 9, steps: 2}\n")
    assert cli.main(["validate", str(recipe_file)]) == 2
    err = capsys.readouterr().err
    assert "model.source" in err and "bytes" in err and "Traceback" not in err


def test_a_pipeline_modules_transformers_model_is_built_as_transformers_builds_it(tmp_path):
    """Text2Video-Zero's safety checker is a transformers model that model_index.json
    files under its pipeline module (``stable_diffusion``): built on the meta device as
    transformers builds it (diffusers' ``from_config`` is not its)."""
    from porter.loading import abstract

    from models.text_to_video_zero import safety_checker

    checker, _ = safety_checker()
    checker.save_pretrained(tmp_path / "safety_checker")
    (tmp_path / "model_index.json").write_text(json.dumps(
        {"_class_name": "TextToVideoZeroPipeline",
         "safety_checker": ["stable_diffusion", "StableDiffusionSafetyChecker"]}))
    [(library, cls)] = abstract.module_classes(tmp_path).values()
    assert (library, cls.__name__) == ("transformers", "StableDiffusionSafetyChecker")
    built = abstract.from_config_dir(library, cls, tmp_path / "safety_checker")
    assert next(built.parameters()).is_meta


def test_a_failed_load_does_not_point_at_a_stack_trace_nobody_sees():
    """diffusers ends a failed hub lookup with "check out the root cause in the
    stacktrace above": a user is shown no stack trace, so the sentence goes."""
    from porter import loading

    cls = type("SomePipeline", (), {})
    error = loading._load_error(cls, "org/none", OSError(
        "Cannot load model org/none: not cached. " + loading.STACK_POINTER))
    assert error.message == "cannot load 'org/none' as SomePipeline: Cannot load model " \
        "org/none: not cached."
