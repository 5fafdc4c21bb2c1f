"""porter run --resume: a missing directory or another output.dir is refused; a resumed run
records each mesh it ran on."""

import pytest

from porter import registry as registry_mod
from porter.commands.run import run

from support import RECIPES
from support.processes import porter_process
from support.runs import tiny_recipe

pytestmark = pytest.mark.slow


def test_resume_of_a_missing_directory_is_an_error(tmp_path):
    done = porter_process("run", str(RECIPES / "wan-tiny.yaml"), "--resume",
                          str(tmp_path / "missing"))
    assert done.returncode == 2 and "nothing to resume" in done.stderr, done.stderr
    assert not (tmp_path / "missing").exists()


def test_resume_with_another_output_dir_is_an_error(tmp_path, capsys):
    from porter import cli

    code = cli.main(["run", str(RECIPES / "wan-tiny.yaml"), "--resume", str(tmp_path / "a"),
                     f"output.dir={tmp_path / 'b'}"])
    assert code == 2 and "name different run directories" in capsys.readouterr().err
    code = cli.main(["run", str(RECIPES / "wan-tiny.yaml"), "--resume", str(tmp_path / "a"),
                     f"output.dir='{tmp_path / 'a'}'"])  # the same one, quoted
    assert code == 2 and "nothing to resume" in capsys.readouterr().err


def test_a_resumed_run_records_each_mesh_it_ran_on(tmp_path):
    out = tmp_path / "out"
    run(tiny_recipe(tmp_path, out, "tiny", "mesh.dp=1"), registry_mod.loaded(),
        progress=False, stage="encode")
    result = run(tiny_recipe(tmp_path, out, "tiny", "mesh.dp=2"), registry_mod.loaded(),
                 progress=False, resume=True)
    meshes = [(s["stage"], s["mesh"]) for s in result.data["history"]]
    assert meshes == [("encode", {"dp": 1}), ("denoise", {"dp": 2}), ("decode", {"dp": 2})]
    assert result.data["history"][1]["steps"] == [0, 2]
