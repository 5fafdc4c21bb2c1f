"""The checks that need no weights refuse what cannot run, and run and plan refuse it with
validate's message: checkpoint configs, seeds, sizes beyond the rotary tables,
unwritable paths."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import yaml

from porter import cli, registry as registry_mod, recipe
from porter.commands.validate import validate

from support import RECIPES, TINY_RECIPE
from support.hostile import SEED_DATA, dump, validates_or_refuses, within
from support.processes import porter_calls, porter_process
from support.runs import RECIPE

pytestmark = pytest.mark.usefixtures("warm")  # timed: JAX and the models imported first


@pytest.mark.slow
@pytest.mark.parametrize("key, value, message", [
    ("num_layers", -3, "num_layers: -3 is a negative count or size"),
    ("num_attention_heads", "two", "num_attention_heads: 'two' is a string where an "
                                   "integer belongs"),
    ("eps", "small", "eps: 'small' is a string where a number belongs"),
])
def test_nonsense_in_a_checkpoint_config_fails_validate(saved_tiny, tmp_path, key, value,
                                                        message):
    source = tmp_path / "ckpt"
    shutil.copytree(saved_tiny, source)
    config = json.loads((source / "transformer" / "config.json").read_text())
    config[key] = value
    (source / "transformer" / "config.json").write_text(json.dumps(config))
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.format(source=source, out=tmp_path / "out"))
    done = porter_process("validate", str(path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"transformer/config.json: {message}" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_valid_checkpoint_config_has_no_value_problems(saved_tiny):
    from porter.loading import config_values
    from porter_cogvideox.tiny import build_pipeline as cogvideox
    from porter_hunyuan.tiny import build_pipeline as hunyuan

    assert config_values.problems(saved_tiny) == []
    for build in (cogvideox, hunyuan):
        directory = saved_tiny.parent / build.__module__.split(".")[0]
        build().save_pretrained(directory)
        assert config_values.problems(directory) == []


@pytest.mark.slow
@pytest.mark.parametrize("case", ["config.json not JSON", "model.config num_layers -3"])
def test_run_and_plan_refuse_what_validate_refuses_with_its_message(saved_tiny, tmp_path,
                                                                   case):
    """`run` (and `plan`) check the model's configuration as `validate` does, on one
    code path: they reached an internal error (OSError, TypeError) or ran a model of
    no blocks. Exit 2 with validate's message, before anything is loaded or written."""
    out = tmp_path / "out"
    args = [str(RECIPES / "wan-tiny.yaml"), f"output.dir={out}"]
    if case == "config.json not JSON":
        source = tmp_path / "ckpt"
        shutil.copytree(saved_tiny, source)
        (source / "transformer" / "config.json").write_text("{not json")
        args.append(f"model.source={source}")
        expected = "transformer/config.json cannot be read as JSON: Expecting"
    else:
        args.append("model.config={num_layers: -3}")
        expected = "model.config.num_layers: -3 is a negative count or size"
    # one new process: the three commands differ only in their arguments
    checked, *others = porter_calls(["validate", *args], ["run", *args, "--no-progress"],
                                    ["plan", *args], user=False)
    assert checked.returncode == 2 and expected in checked.stderr, checked.stderr
    message = checked.stderr[checked.stderr.index("error:"):]
    for done in others:
        assert done.returncode == 2, done.stderr
        assert done.stderr.endswith(message), done.stderr
        assert "internal error" not in done.stderr and "loading" not in done.stderr
    assert not out.exists()


@pytest.mark.slow
def test_seed_beyond_torch_range_fails_validate(capsys):
    code = cli.main(["validate", str(RECIPES / "wan-tiny.yaml"), f"generate.seed={2**64}"])
    assert code == 2 and "generate.seed" in capsys.readouterr().err
    assert cli.main(["validate", str(RECIPES / "wan-tiny.yaml"),
                     f"generate.seed={2**64 - 1}"]) == 0


@pytest.mark.slow
def test_sizes_beyond_the_rotary_tables_fail_validate(capsys):
    code = cli.main(["validate", str(RECIPES / "wan-tiny.yaml"), "generate.width=1024"])
    err = capsys.readouterr().err
    assert code == 2 and "generate.width: 1024 pixels make 64 positions" in err
    assert "rotary tables hold 32" in err


@pytest.mark.slow
def test_unwritable_output_and_cache_paths_fail_validate(tmp_path, capsys, monkeypatch):
    """An unwritable output.dir is a problem; an unwritable compile cache, optional in a
    run as well, a warning."""
    monkeypatch.delenv("PORTER_CACHE_DIR")  # it would win over runtime.compile_cache
    (tmp_path / "file").write_text("x")
    code = cli.main(["validate", str(RECIPES / "wan-tiny.yaml"),
                     f"output.dir={tmp_path / 'file' / 'out'}"])
    assert code == 2 and "output.dir: cannot write" in capsys.readouterr().err
    code = cli.main(["validate", str(RECIPES / "wan-tiny.yaml"),
                     f"runtime.compile_cache={tmp_path / 'file' / 'cache'}"])
    assert code == 0
    assert "warning: the compile cache cannot be written" in capsys.readouterr().err


@pytest.mark.parametrize("key,value,expected", [
    ("source", "x" * 300, "model.source: cannot look at this path: File name too long"),
    ("source", "~nosuchuser_porter/ckpt", "model.source: cannot expand '~nosuchuser_porter'"),
    ("source", "a\0b", "model.source: a path cannot contain a NUL character"),
    ("dir", "a\0b", "output.dir: a path cannot contain a NUL character"),
    ("compile_cache", "a\0b", "runtime.compile_cache: a path cannot contain a NUL"),
    ("image", "y" * 300, "generate.image: cannot look at this path: File name too long"),
    ("image", "~nosuchuser_porter/a.png", "generate.image: cannot expand"),
    ("vae", "v" * 300, "model.vae: cannot look at this path: File name too long"),
    ("text_encoder", "~nosuchuser_porter/t.pth", "model.text_encoder: cannot expand"),
])
def test_hostile_paths_are_problems(write, key, value, expected):
    data = yaml.safe_load(TINY_RECIPE)
    section = {"source": "model", "dir": "output", "compile_cache": "runtime",
               "image": "generate", "vae": "model", "text_encoder": "model"}[key]
    data.setdefault(section, {})[key] = value
    if key == "image":
        data["model"]["variant"] = "i2v"
    path = write("r.yaml", dump(data))
    exc = validates_or_refuses(path)
    problems = exc.problems if exc else validate(recipe.load(path),
                                                        registry_mod.loaded())
    assert any(expected in problem.render() for problem in problems), problems


@pytest.mark.parametrize("config,expected", [
    ("{num_layers: abc}", "TypeError"),
    ("{num_attention_heads: -3}", "cannot be built"),
    ("{num_attention_heads: 100000000, attention_head_dim: 1000000}", "cannot be built"),
    ("{patch_size: {a: 1}}", "cannot be built"),
    ("{num_layers: 1000000000}", "too large to check"),
])
def test_model_config_problems_are_bounded(write, config, expected):
    path = write("r.yaml", TINY_RECIPE.replace("source: tiny}", f"source: tiny, config: "
                                               f"{config}}}"))
    loaded = recipe.load(path)
    with within(30):
        problems = validate(loaded, registry_mod.loaded())
    assert [problem.path for problem in problems] == ["model.config"]
    assert expected in problems[0].message


def test_model_config_of_a_checkpoint_is_refused(write):
    """model.config shapes a tiny model only: on a hub id it would be silently ignored
    (a 40-block Wan 14B stays 40 blocks)."""
    path = write("r.yaml", TINY_RECIPE.replace(
        "source: tiny}", "source: Wan-AI/Wan2.1-T2V-14B-Diffusers, config: {num_layers: 1}}"))
    problems = validate(recipe.load(path), registry_mod.loaded())
    assert [problem.path for problem in problems] == ["model.config"]
    assert "source: tiny" in problems[0].hint


@pytest.mark.parametrize("files,expected", [
    ({"model_index.json": "{"}, "model_index.json is not valid JSON: Expecting"),
    ({"model_index.json": '["not", "a", "mapping"]'}, "is not a diffusers pipeline index"),
    ({"model_index.json": '{"transformer": ["diffusers"]}'},
     "is not a diffusers pipeline index"),
    ({"model_index.json": '{"transformer": ["diffusers", "WanTransformer3DModel"]}'},
     "transformer/config.json is missing (model_index.json names transformer)"),
    ({"model_index.json": '{"transformer": ["diffusers", "WanTransformer3DModel"]}',
      "transformer/config.json": '{"num_layers": 2'}, "cannot be read as JSON"),
    ({"model_index.json": '{"transformer": ["diffusers", "WanTransformer3DModel"]}',
      "transformer/config.json": '{"num_layers": "abc"}'},
     "num_layers: 'abc' is a string where an integer belongs"),
    ({"model_index.json": '{"transformer": ["diffusers", "WanTransformer3DModel"]}',
      "transformer/config.json": '{"num_layers": 100000000}'}, "too large to check"),
])
def test_hostile_checkpoint_configs_are_problems(write, tmp_path, files, expected):
    """A local checkpoint's configuration files are input too: validate builds the
    model from them for the shape checks."""
    ckpt = tmp_path / "ckpt"
    for name, text in files.items():
        (ckpt / name).parent.mkdir(parents=True, exist_ok=True)
        (ckpt / name).write_text(text)
    data = copy.deepcopy(SEED_DATA["wan-tiny-tp.yaml"])  # it has sharding rules
    data["model"]["source"] = str(ckpt)
    loaded = recipe.load(write("r.yaml", dump(data)))
    with within(60):
        problems = validate(loaded, registry_mod.loaded())
    assert [problem.path for problem in problems] == ["model.source"]
    assert expected in problems[0].message


def test_a_call_is_held_to_the_memory_free_now_beyond_the_loaded_weights(write,
                                                                        monkeypatch):
    """A server's job: its attention's scores (weights already loaded) against what a
    device can still take, less a margin; the scores grow with the size asked."""
    from porter.port import checks
    from porter.runtime import memory

    loaded = recipe.load(write("r.yaml", TINY_RECIPE), ["mesh.dp=1"])
    registry = registry_mod.loaded()
    free = memory.Limit(checks.FREE_MARGIN + 2**20, "what is free here")
    monkeypatch.setattr(memory, "device_free", lambda devices: free)
    assert checks.headroom_problems(loaded, registry) == []  # well under a MiB
    larger = recipe.with_values(loaded, "generate", {"frames": 81, "height": 128,
                                                     "width": 128}, "request")
    [problem] = checks.headroom_problems(larger, registry, ("frames", "height"))
    assert problem.path == "generate.frames" and problem.where() == "request"
    assert "not enough memory free now" in problem.message
    assert "a device can take 1.00 GiB now (set by what is free here" in problem.message
