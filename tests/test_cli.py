"""Bad input gets a short error and exit code 2; never a traceback."""

import pytest

from porter import cli

from conftest import RECIPES, TINY_RECIPE


def porter(capsys, *args):
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_help_teaches(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert "porter run recipes/wan-tiny.yaml" in out and "exit codes" in out


def test_validate_shipped_recipe(capsys):
    code, out, _ = porter(capsys, "validate", str(RECIPES / "wan-tiny.yaml"))
    assert code == 0 and "ok" in out


def test_missing_recipe_file(capsys, tmp_path):
    code, _, err = porter(capsys, "validate", str(tmp_path / "missing.yaml"))
    assert code == 2 and "recipe file not found" in err


def test_yaml_syntax_error_has_line(capsys, write):
    path = write("r.yaml", "model:\n  family: [wan\n")
    code, _, err = porter(capsys, "run", str(path))
    assert code == 2 and f"{path}:" in err and "YAML syntax error" in err


def test_unknown_family(capsys, write):
    path = write("r.yaml", TINY_RECIPE.replace("family: wan", "family: wna"))
    code, _, err = porter(capsys, "run", str(path))
    assert code == 2 and "unknown model family 'wna'" in err and "did you mean 'wan'" in err
    assert f"{path}:1: model.family" in err


def test_source_path_that_does_not_exist(capsys, write):
    path = write("r.yaml", TINY_RECIPE)
    code, _, err = porter(capsys, "run", str(path), "model.source=./no/such/dir")
    assert code == 2 and "model.source" in err and "not 'tiny', an existing directory" in err


def test_mesh_needing_more_devices(capsys, write):
    path = write("r.yaml", TINY_RECIPE)
    code, _, err = porter(capsys, "validate", str(path), "mesh.dp=16")
    assert code == 2 and "needs 16 devices but 8 exist" in err


def test_unknown_override_key(capsys, write):
    path = write("r.yaml", TINY_RECIPE)
    code, _, err = porter(capsys, "run", str(path), "generate.stpes=4")
    assert code == 2 and "command line: generate.stpes: unknown key" in err
    assert "did you mean 'steps'" in err


def test_wan_shape_rules(capsys, write):
    path = write("r.yaml", TINY_RECIPE)
    code, _, err = porter(capsys, "validate", str(path), "generate.frames=10",
                          "generate.height=40")
    assert code == 2 and "4n+1 frames" in err and "multiple of 16" in err
    assert "try 9 or 13" in err and "try 32 or 48" in err


def test_internal_failure_is_exit_1_without_traceback(capsys, monkeypatch, write):
    def explode(*args, **kwargs):
        raise ZeroDivisionError("deep inside")
    monkeypatch.setattr("porter.commands.run.run", explode)
    code, _, err = porter(capsys, "run", str(write("r.yaml", TINY_RECIPE)))
    assert code == 1 and "internal error: ZeroDivisionError" in err and "--debug" in err


def test_debug_shows_traceback(write):
    with pytest.raises(Exception):
        cli.main(["--debug", "run", str(write("r.yaml", "model: [")), ])


def test_plugins_lists_registrations(capsys):
    code, out, _ = porter(capsys, "plugins")
    assert code == 0
    assert "wan: family wan" in out and "hunyuan: family hunyuan" in out


def test_overrides_may_follow_flags(capsys, write):
    path = write("r.yaml", TINY_RECIPE)
    code, _, err = porter(capsys, "validate", str(path), "--cpu-devices", "8", "mesh.dp=16")
    assert code == 2 and "needs 16 devices but 8 exist" in err


def test_stray_argument_is_a_usage_error(capsys, write):
    with pytest.raises(SystemExit) as info:
        cli.main(["validate", str(write("r.yaml", TINY_RECIPE)), "--bogus"])
    assert info.value.code == 2 and "--bogus" in capsys.readouterr().err


def test_cpu_devices_flag_in_a_fresh_process():
    """--cpu-devices must reach JAX before it creates devices, whatever was imported."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-m", "porter.cli", "validate",
                          str(RECIPES / "wan-tiny-tp.yaml"), "--cpu-devices", "8"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "mesh {'dp': 2, 'tp': 4}" in out.stdout


def fresh_porter(*args):
    """The porter command in a new process with one CPU device and nothing imported
    first: what a user's shell runs."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.run([sys.executable, "-m", "porter.cli", *args], capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.mark.parametrize("args", [
    ["plugins"], ["patches"], ["--help"], ["run", "--help"], ["serve", "--help"],
    ["calibrate", "--help"],
    ["validate", str(RECIPES / "wan14b.yaml"), "--devices", "8"],
    ["plan", str(RECIPES / "wan1.3b.yaml"), "--devices", "8"],
    ["inspect", str(RECIPES / "wan-tiny-tp.yaml")]], ids=lambda a: " ".join(a[:2]))
def test_commands_in_a_fresh_process(args):
    out = fresh_porter(*args)
    assert out.returncode == 0, out.stderr
    assert "internal error" not in out.stderr and "Traceback" not in out.stderr


def test_a_recipe_for_a_bigger_machine_validates_with_devices():
    """On one CPU device, an 8-chip recipe's mesh is refused with the flag that checks
    it as if; with --devices 8 every rule is checked against 8 devices."""
    out = fresh_porter("validate", str(RECIPES / "wan14b.yaml"))
    assert out.returncode == 2 and "needs 8 devices but 1 exist" in out.stderr
    assert "--devices 8" in out.stderr and "--cpu-devices 8" in out.stderr
    out = fresh_porter("validate", str(RECIPES / "wan14b.yaml"), "--devices", "8",
                       "mesh.tp=16", "mesh.dp=1")
    assert out.returncode == 2 and "needs 16 devices but --devices gives 8" in out.stderr
    out = fresh_porter("validate", str(RECIPES / "wan14b.yaml"), "--devices", "3",
                       "mesh.tp=3", "mesh.dp=1", "generate.cfg_parallel=false")
    assert out.returncode == 2  # 14B's width 5120 does not split 3 ways
    assert "(5120) does not divide by tp=3" in out.stderr


@pytest.mark.slow
def test_working_commands_in_a_fresh_process(tmp_path):
    """new, verify, bench and a generic run, each in a new process with nothing
    imported first (the list above holds the commands that read recipes only). The run
    is Mochi: its attention is split automatically, in a process that imported nothing."""
    out = fresh_porter("new", str(tmp_path / "mine.yaml"), "--family", "generic")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "mine.yaml").exists()
    tiny = str(RECIPES / "wan-tiny.yaml")
    for args in (["verify", tiny, "mesh.dp=1"], ["bench", tiny, "--steps", "1", "mesh.dp=1"]):
        out = fresh_porter(*args)
        assert out.returncode == 0, out.stderr
        assert "internal error" not in out.stderr and "Traceback" not in out.stderr

    from models.mochi import build_mochi_pipeline
    build_mochi_pipeline().save_pretrained(tmp_path / "mochi")
    (tmp_path / "mochi.yaml").write_text(f"""\
model: {{family: generic, source: {tmp_path / 'mochi'}}}
generate: {{prompt: a cat, height: 16, width: 16, frames: 7, steps: 2,
           max_sequence_length: 16}}
output: {{dir: {tmp_path / 'out'}}}
""")
    out = fresh_porter("run", str(tmp_path / "mochi.yaml"))
    assert out.returncode == 0, out.stderr
    assert "transformer cannot be compiled whole" in out.stderr
    assert (tmp_path / "out" / "video.mp4").exists()
