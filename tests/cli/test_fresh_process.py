"""Every subcommand in a new process with nothing imported first, as a user's shell runs
it."""

import pytest

from support import RECIPES
from support.processes import porter_calls, user_porter


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
    assert "mesh dp=2 x tp=4" in out.stdout


@pytest.mark.parametrize("args", [
    ["plugins"], ["patches"], ["--help"], ["run", "--help"], ["serve", "--help"],
    ["calibrate", "--help"],
    ["validate", str(RECIPES / "wan14b.yaml"), "--devices", "8"],
    ["plan", str(RECIPES / "wan1.3b.yaml"), "--devices", "8"],
    ["inspect", str(RECIPES / "wan-tiny-tp.yaml")]], ids=lambda a: " ".join(a[:2]))
def test_commands_in_a_fresh_process(args):
    out = user_porter(*args)
    assert out.returncode == 0, out.stderr
    assert "internal error" not in out.stderr and "Traceback" not in out.stderr


def test_a_recipe_for_a_bigger_machine_validates_with_devices():
    """On one CPU device, an 8-chip recipe's mesh is refused with the flag that checks
    it as if; with --devices 8 every rule is checked against 8 devices (three validates
    in one new process: they differ only in their arguments)."""
    recipe = str(RECIPES / "wan14b.yaml")
    one, sixteen, three = porter_calls(
        ["validate", recipe], ["validate", recipe, "--devices", "8", "mesh.tp=16", "mesh.dp=1"],
        ["validate", recipe, "--devices", "3", "mesh.tp=3", "mesh.dp=1",
         "generate.cfg_parallel=false"])
    assert one.returncode == 2 and "needs 8 devices but 1 exist" in one.stderr
    assert "--devices 8" in one.stderr and "--cpu-devices 8" in one.stderr
    assert sixteen.returncode == 2 and "needs 16 devices but --devices gives 8" in sixteen.stderr
    assert three.returncode == 2  # 14B's width 5120 does not split 3 ways
    assert "(5120) does not divide by tp=3" in three.stderr


@pytest.mark.slow
def test_working_commands_in_a_fresh_process(tmp_path):
    """new, verify, bench and a generic run, each in a new process with nothing
    imported first (the list above holds the commands that read recipes only). The run
    is Mochi: its attention is split automatically, in a process that imported nothing."""
    out = user_porter("new", str(tmp_path / "mine.yaml"), "--family", "generic")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "mine.yaml").exists()
    tiny = str(RECIPES / "wan-tiny.yaml")
    for args in (["verify", tiny, "mesh.dp=1"], ["bench", tiny, "--steps", "1", "mesh.dp=1"]):
        out = user_porter(*args)
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
    out = user_porter("run", str(tmp_path / "mochi.yaml"))
    assert out.returncode == 0, out.stderr
    assert "transformer cannot be compiled whole" in out.stderr
    assert (tmp_path / "out" / "video.mp4").exists()


@pytest.mark.slow
def test_a_modular_pipeline_with_sound_in_fresh_processes(tmp_path):
    """LTX2ModularPipeline over a classic LTX-2 checkpoint, as a user runs it: validate,
    then compile for a TPU (its programs found by running its call on abstract
    components) in one new process, and the run in another, whose mp4 carries the sound
    beside the frames and whose record says so."""
    import json

    import av

    from models.ltx2 import build_ltx2_pipeline

    build_ltx2_pipeline().save_pretrained(tmp_path / "ltx2")
    recipe = tmp_path / "ltx2.yaml"
    recipe.write_text(f"""\
model: {{family: generic, source: {tmp_path / 'ltx2'}, pipeline: LTX2ModularPipeline}}
generate: {{prompt: a cat, height: 32, width: 32, frames: 9, steps: 2,
           max_sequence_length: 16, extra: {{frame_rate: 25.0}}}}
output: {{dir: {tmp_path / 'out'}, fps: 25, wav: true}}
""")
    # the checks share a process, porter's main called for each in turn (so the compile
    # runs there, not in the child the porter command starts for libtpu: that child is
    # tests/cli/test_child.py's); the run has a process of its own
    checked, compiled = porter_calls(["validate", recipe, "--devices", "8"],
                                     ["compile", recipe, "--target", "v6e-8", "--program",
                                      "vae.decode"])
    assert checked.returncode == 0, checked.stderr
    assert compiled.returncode == 0, compiled.stderr
    assert "vae.decode [decode, 1 call(s)]" in compiled.stdout
    out = user_porter("run", recipe)
    assert out.returncode == 0, out.stderr
    assert "sound" in out.stdout and "audio.wav" in out.stdout
    with av.open(str(tmp_path / "out" / "video.mp4")) as container:
        kinds = sorted(stream.type for stream in container.streams)
    assert kinds == ["audio", "video"]
    written = json.loads((tmp_path / "out" / "run.json").read_text())["outputs"]
    assert written["audio"]["sample_rate"] == 16000 and written["audio"]["wav"]


#: what a command that reads no model must not import (seconds each: torch, JAX,
#: diffusers, transformers)
HEAVY = ("torch", "jax", "diffusers", "transformers", "torchax")


def _imported(args, cwd=None, env=None) -> tuple[list[str], str]:
    """Which of HEAVY a fresh `porter ARGS` process imported, and what it printed; the
    command itself must have succeeded. ``env``: variables set for it."""
    import ast
    import os
    import subprocess
    import sys

    code = ("import runpy, sys; sys.argv = ['porter', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('porter.cli', run_name='__main__')\n"
            "except SystemExit as exit:\n    assert exit.code in (0, None), exit.code\n"
            f"print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                         text=True, timeout=120, cwd=cwd, env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr
    *printed, last = out.stdout.strip().splitlines()
    return ast.literal_eval(last.removeprefix("HEAVY ")), "\n".join(printed)


def _subcommands() -> list[str]:
    from porter.cli import SUBCOMMANDS

    return sorted(SUBCOMMANDS)


@pytest.mark.parametrize("args", [["--help"], *([name, "--help"] for name in _subcommands())],
                         ids=" ".join)
def test_help_imports_no_heavy_library(args):
    """The import set of the light commands, not their time: `porter --help` and each
    subcommand's help start in a fraction of a second because none of these is
    imported (benchmarks/README.md, "Time to the first video")."""
    imported, printed = _imported(args)
    assert imported == [] and "usage: porter" in printed


@pytest.mark.parametrize("args", [["plugins"], ["new", "starter", "--family", "wan"]],
                         ids=" ".join)
def test_plugin_discovery_imports_no_heavy_library(args, tmp_path):
    """Loading the plugins (their families, patches and attention backends) imports
    none of HEAVY, torch and JAX included: those come with the first model a command
    builds or the first tensor it makes (``porter.shims.lazy``)."""
    imported, printed = _imported(args, cwd=tmp_path)
    assert imported == []
    assert "wan" in printed if args == ["plugins"] else \
        (tmp_path / "recipes" / "starter.yaml").is_file()


@pytest.mark.parametrize("args", [["validate", "--devices", "8"], ["plan", "--devices", "8"],
                                  ["validate"]], ids=" ".join)
def test_checks_of_a_model_checked_before_import_no_model_library(args, tmp_path):
    """`porter validate` and `porter plan` of a model checked before read its kept
    sketches (``porter.loading.kept_sketches``): none of torch, diffusers and
    transformers is imported (JAX is: the runtime's set-up asks it whether a TPU is
    attached). The first check builds the model on the meta device, as always."""
    env = {"PORTER_CACHE_DIR": str(tmp_path / "cache")}
    command = [*args, str(RECIPES / "wan-tiny.yaml")]
    first, _ = _imported(command, env=env)
    assert "torch" in first and "diffusers" in first
    again, printed = _imported(command, env=env)
    assert again == ["jax"], printed
    assert ("ok" in printed) if args[0] == "validate" else ("transformer" in printed)
