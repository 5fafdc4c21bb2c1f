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
    for section in ("model:", "runtime:", "mesh:", "generate:", "patches:", "rotary:",
                    "dtypes:", "sharding:", "attention:", "compile:", "verify:", "output:"):
        assert section in text, section
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
