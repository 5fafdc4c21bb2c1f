"""porter run --resume: a missing directory, a folder no run wrote, or another output.dir
is refused; a resumed run records each mesh it ran on; a finished run is left as it is."""

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


def test_resume_of_a_folder_no_run_wrote_is_refused_and_its_files_kept(tmp_path, capsys):
    """A folder of the user's own (a video, a record) is not resumed: a resume would
    start over there and replace them."""
    from porter import cli

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "video.mp4").write_bytes(b"the user's own video")
    (mine / "run.json").write_text('{"mine": 1}')
    code = cli.main(["run", str(RECIPES / "wan-tiny.yaml"), "--resume", str(mine)])
    err = capsys.readouterr().err
    assert code == 2 and f"no Porter run has written to {mine}" in err, err
    assert (mine / "video.mp4").read_bytes() == b"the user's own video"
    assert sorted(p.name for p in mine.iterdir()) == ["run.json", "video.mp4"]


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
    _finished_is_left_as_it_is(tmp_path, out, result)


def _finished_is_left_as_it_is(tmp_path, out, result):
    """Resumed once more, the finished run is said to be finished: no weight is loaded,
    nothing decoded again, no file touched. What makes a run unfinished: other settings
    (generation, setup or output), other checkpoint files, a result gone; not a stage
    file or the stream removed to save space."""
    from porter import api
    from porter.rundir import artifacts, results

    def loads(*args, **kwargs):
        raise AssertionError("a finished run loaded its model")

    def files():  # the run's own (the folder's lock is taken and let go)
        return {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name[0] != "."}

    touched = files()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(api.Port, "open", loads)
        again = run(tiny_recipe(tmp_path, out, "tiny", "mesh.dp=2"), registry_mod.loaded(),
                    progress=False, resume=True)
        assert again.finished and again.data == result.data
        assert again.video == out / "video.mp4" and again.record == out / "run.json"
    # as a user runs it, in a new process
    done = porter_process("run", tmp_path / "r.yaml", "--resume", out, "--no-progress")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"nothing run: {out} holds this recipe's finished run (video.mp4, run.json); "
        "run without --resume to make it again\n")
    assert files() == touched
    recipe = tiny_recipe(tmp_path, out, "tiny")

    def made_from():
        return artifacts.inputs_now(recipe)

    assert results.finished(out, recipe, made_from) is not None
    for other in ("generate.seed=1", "output.fps=8", "output.latents=true",
                  "setup={vae: [enable_tiling]}"):
        assert results.finished(out, tiny_recipe(tmp_path, out, "tiny", other),
                                made_from) is None, other
    assert results.finished(out, recipe, lambda: {**made_from(), "checkpoint_files": {
        "transformer": "another"}}) is None
    assert results.finished(out, tiny_recipe(tmp_path, out, "tiny", "output.dir=elsewhere",
                                             "output.checkpoint_every=3",
                                             "output.stream=false"), made_from)
    (out / "encode.safetensors").unlink()
    (out / "stream.mp4").unlink()
    assert results.finished(out, recipe, made_from) is not None
    (out / "video.mp4").unlink()
    assert results.finished(out, recipe, made_from) is None


def test_a_folder_with_porters_records_but_no_lock_resumes(tmp_path):
    """A run's folder copied without its dot files, or a batch split between processes
    (which locks its items' folders, not its own), is still Porter's to resume."""
    from porter.rundir import lifecycle

    for name in ("encode.json", "batch-0.json", "item-1/.porter.lock"):
        folder = tmp_path / name.replace("/", "_")
        (folder / name).parent.mkdir(parents=True)
        (folder / name).write_text("{}")
        lifecycle.resume_problem(folder, resume=True)  # no UsageError
