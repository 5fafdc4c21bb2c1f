"""porter new writes recipes that validate, for every family and from an existing recipe."""

import pytest

from porter import cli, registry as registry_mod, recipe
from porter.commands.validate import validate

from support import RECIPES


def test_new_recipe_validates(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["new", "mine", "--family", "wan"]) == 0
    path = tmp_path / "recipes" / "mine.yaml"
    text = path.read_text()
    assert text.startswith("# porter run recipes/mine.yaml")
    from porter.recipe.schema import RecipeSpec

    for section in RecipeSpec.model_fields:  # every section, as the help says
        assert f"\n{section}:" in text, section
    assert validate(recipe.load(path), registry_mod.loaded()) == []
    assert cli.main(["new", "mine", "--family", "wan"]) == 2  # no silent overwrite
    assert "exists" in capsys.readouterr().err


def test_new_from_existing_extends_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["new", "variants/bigger.yaml", "--family", "wan",
                     "--from", str(RECIPES / "wan-tiny-tp.yaml")]) == 0
    loaded = recipe.load(tmp_path / "variants" / "bigger.yaml")
    assert loaded.mesh == {"dp": 2, "tp": 4}  # inherited
    assert validate(loaded, registry_mod.loaded()) == []


@pytest.mark.parametrize("family", ["wan", "generic"])
def test_new_for_every_family_parses(tmp_path, monkeypatch, family):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["new", f"n-{family}", "--family", family]) == 0
    loaded = recipe.load(tmp_path / "recipes" / f"n-{family}.yaml")
    assert loaded.model.family == family


def test_a_starter_takes_what_every_recipe_of_its_family_does(tmp_path, monkeypatch):
    """Wan's starter lists the patches every Wan recipe takes and precomputes its rotary
    tables, as recipes/wan-tiny.yaml; a family without a rotary cache says so."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["new", "w", "--family", "wan"]) == 0
    wan = recipe.load(tmp_path / "recipes" / "w.yaml")
    shipped = recipe.load(RECIPES / "wan-tiny.yaml")
    assert wan.patches == shipped.patches and wan.rotary.precompute
    assert cli.main(["new", "g", "--family", "generic"]) == 0
    assert not recipe.load(tmp_path / "recipes" / "g.yaml").rotary.precompute


def test_from_an_existing_recipe_its_family_is_taken_and_a_misspelled_one_is_named(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["new", "mine", "--from", str(RECIPES / "wan-tiny.yaml")]) == 0
    assert "Starter recipe for the wan family" in (tmp_path / "recipes" / "mine.yaml").read_text()
    capsys.readouterr()
    assert cli.main(["new", "other", "--family", "wann"]) == 2
    assert "did you mean 'wan'?" in capsys.readouterr().err
    assert cli.main(["new", "other"]) == 2
    assert "needs --family (or --from an existing recipe)" in capsys.readouterr().err


def test_a_family_other_than_the_base_recipes_is_refused(tmp_path, monkeypatch, capsys):
    """A recipe extending a Wan recipe runs as Wan: --family cogvideox with it would
    write a header that says otherwise."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["new", "x", "--from", str(RECIPES / "wan-tiny.yaml"),
                     "--family", "cogvideox"]) == 2
    err = capsys.readouterr().err
    assert "--family cogvideox differs from wan" in err and "drop --family" in err
    assert not (tmp_path / "recipes" / "x.yaml").exists()
