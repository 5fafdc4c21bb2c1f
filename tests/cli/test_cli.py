"""The porter command: bad input gets a short error and exit code 2, never a traceback;
flags and overrides in any order."""

import pytest

from porter import cli

from support import RECIPES, TINY_RECIPE


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
    assert code == 2 and "overrides: generate.stpes: unknown key" in err
    assert "did you mean 'steps'" in err


def test_wan_shape_rules(capsys, write):
    path = write("r.yaml", TINY_RECIPE)
    code, _, err = porter(capsys, "validate", str(path), "generate.frames=10",
                          "generate.height=40")
    assert code == 2 and "4n+1 frames" in err and "multiple of 16" in err
    assert "try 9 or 13" in err and "try 32 or 48" in err
    # below the smallest size there is one to suggest, not the same one twice
    code, _, err = porter(capsys, "validate", str(path), "generate.height=8")
    assert code == 2 and "hint: try 16 (the VAE" in err


def test_internal_failure_is_exit_1_without_traceback(capsys, monkeypatch, write):
    def explode(*args, **kwargs):
        raise ZeroDivisionError("deep inside")
    monkeypatch.setattr("porter.commands.run.run", explode)
    code, _, err = porter(capsys, "run", str(write("r.yaml", TINY_RECIPE)))
    assert code == 1 and "internal error: ZeroDivisionError" in err and "--debug" in err


def test_debug_shows_traceback_and_keeps_the_exit_code(capsys, write):
    """--debug adds the traceback; a recipe's problem is still the user's (exit 2,
    with its message), not a Porter bug (exit 1)."""
    code = cli.main(["--debug", "run", str(write("r.yaml", "model: ["))])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback (most recent call last)" in err
    assert "RecipeError" in err and "YAML syntax error" in err.split("RecipeError")[-1]


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


def test_debug_is_taken_after_the_command_too(capsys, write):
    """Every hint says "rerun with --debug"; users add it at the end."""
    code = cli.main(["run", str(write("r.yaml", "model: [")), "--debug"])
    assert code == 2 and "Traceback (most recent call last)" in capsys.readouterr().err


def test_a_misspelled_command_or_flag_is_named_with_the_nearest(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["rnu", str(TINY_RECIPE)])
    assert info.value.code == 2
    assert "unknown command 'rnu'; did you mean 'run'?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["run", str(TINY_RECIPE), "--step", "3"])
    err = capsys.readouterr().err
    assert err.startswith("usage: porter run")  # the command's own usage, not porter's
    assert "unrecognized arguments: --step 3; did you mean --stage?" in err
    with pytest.raises(SystemExit):
        cli.main(["run"])
    assert "the following arguments are required: recipe\n" in capsys.readouterr().err


@pytest.mark.parametrize("flag, meant", [
    (["--steps", "3"], "generate.steps=3"),
    (["--height=480"], "generate.height=480"),
    (["--out", "videos/"], "output.dir=videos/"),
    (["--num-frames", "9"], "generate.frames=9"),
    (["--frames", "9"], "generate.frames=9 or output.frames=9"),
    (["--model", "org/x"], "model.source=org/x"),
    (["--prompt", "a cat"], "'generate.prompt=a cat'"),  # not taken as --prompts FILE
    (["--negative-prompt", "blurry, bad"], "'generate.negative_prompt=blurry, bad'"),
])
def test_a_recipe_key_written_as_a_flag_is_named_as_an_override(capsys, flag, meant):
    """Users bring flags from other tools; Porter's settings are the recipe's keys."""
    with pytest.raises(SystemExit) as info:
        cli.main(["run", str(TINY_RECIPE), *flag])
    assert info.value.code == 2
    assert f"recipe keys are set as KEY=VALUE: did you mean {meant}?" in \
        capsys.readouterr().err


def test_a_section_written_as_a_flag_is_not_offered_as_a_key(capsys):
    for flag in ("--lora", "--mesh"):  # a list of adapters, a mapping of axes
        with pytest.raises(SystemExit):
            cli.main(["run", str(TINY_RECIPE), flag, "x"])
        assert "did you mean" not in capsys.readouterr().err


def test_a_mesh_too_large_is_said_at_its_line_with_a_mesh_that_fits(capsys):
    for command in ("plan", "validate"):
        code, _, err = porter(capsys, command, str(RECIPES / "wan-tiny-tp.yaml"),
                              "--devices", "3")
        assert code == 2 and "wan-tiny-tp.yaml:8: mesh: mesh dp=2 x tp=4 needs 8" in err
        assert "shrink the mesh (e.g. mesh.dp=1 mesh.tp=2) or give --devices 8" in err


def test_a_missing_recipe_points_at_the_nearest_name(capsys, tmp_path):
    code, _, err = porter(capsys, "validate", str(RECIPES / "wan-tiy.yaml"))
    assert code == 2 and f"did you mean {RECIPES / 'wan-tiny.yaml'}?" in err
    code, _, err = porter(capsys, "validate", str(tmp_path / "nothing-like-it.yaml"))
    assert code == 2 and f"Porter's own recipes are in {RECIPES}" in err


def test_the_version_and_no_arguments_at_all(capsys):
    """--version for a bug report (on stdout, exit 0); `porter` alone shows the help
    (exit 2, as any call without its command), not argparse's one-line complaint."""
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and out.startswith("porter ") and len(out.split()) == 2
    with pytest.raises(SystemExit) as info:
        cli.main([])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "examples:" in err and "exit codes:" in err


def test_validate_says_what_it_could_not_check(capsys, write):
    """A hub id with no configuration here (offline): ok, but not silently for the
    shapes and sharding rules it had nothing to check against."""
    path = write("r.yaml", "model: {family: generic, source: someone/not-here-model}\n"
                 "generate: {prompt: a cat, height: 32, width: 32, frames: 9, steps: 2}\n"
                 "sharding: {weights: {transformer: [{match: 'nothing', spec: [dp]}]}}\n")
    code, out, _ = porter(capsys, "validate", str(path))
    assert code == 0 and "shapes and sharding rules not checked: no configuration of " \
        "someone/not-here-model here" in out


def test_arguments_in_the_wrong_order_are_named_as_that(capsys, write):
    path = str(write("r.yaml", TINY_RECIPE))
    code, _, err = porter(capsys, "validate", "generate.steps=2", path)
    assert code == 2 and "an override where the recipe file belongs" in err
    assert "porter validate RECIPE.yaml generate.steps=2" in err
    code, _, err = porter(capsys, "validate", path, path)
    assert code == 2 and "takes one recipe" in err and "extends" in err
