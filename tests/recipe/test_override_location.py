"""A problem in a section that only overrides made (the command line's, the library's)
is reported at those overrides, not at line 1 of a recipe file that has no such
section."""

import pytest

import porter
from porter import recipe
from porter.errors import RecipeError

from support import RECIPES
from support.processes import porter_calls

WAN = RECIPES / "wan-tiny.yaml"


def test_a_section_made_on_the_command_line_is_located_there():
    loaded = recipe.load(WAN, ["quantize.include=[x]"])
    assert loaded.problem("quantize", "m").where() == "overrides (quantize.include)"
    # a key of that section nobody set: still the override that made the section
    assert loaded.problem("quantize.format", "m").where() == "overrides (quantize.include)"
    assert loaded.problem("quantize.include", "m").where() == "overrides"
    # what the file holds keeps its own line; the root is still the file's line 1
    line = next(number for number, text in enumerate(WAN.read_text().splitlines(), 1)
                if text.strip().startswith("steps:"))
    assert loaded.problem("generate.steps", "m").where() == f"{WAN}:{line}"
    assert loaded.problem("", "m").where() == f"{WAN}:1"
    many = recipe.load(WAN, [f"quantize.{key}={value}" for key, value in [
        ("format", "int8"), ("components", "[transformer]"), ("include", "[x]"),
        ("exclude", "[y]")]])
    assert many.problem("quantize", "m").where() == (
        "overrides (quantize.format, quantize.components, quantize.include and 1 more)")


def test_a_section_of_the_file_changed_on_the_command_line_names_both():
    """mesh: in the file, mesh.dp=3 given: a problem of the mesh is about the two."""
    line = next(number for number, text in enumerate(WAN.read_text().splitlines(), 1)
                if text.startswith("mesh:"))
    loaded = recipe.load(WAN, ["mesh.dp=3"])
    assert loaded.problem("mesh", "m").where() == f"overrides (mesh.dp) over {WAN}:{line}"
    assert loaded.problem("mesh.dp", "m").where() == "overrides"
    assert recipe.load(WAN).problem("mesh", "m").where() == f"{WAN}:{line}"


def test_porter_validate_names_the_overrides():
    """As a user runs it (fresh process): both problems were reported at
    `recipes/wan-tiny.yaml:1`, a file with no quantize section."""
    nameless, vae = porter_calls(
        ["validate", WAN, "quantize.include=[x]"],
        ["validate", WAN, "quantize.components=[vae]", "quantize.format=int8"])
    assert nameless.returncode == 2 and vae.returncode == 2
    assert "  overrides (quantize.include): quantize: layers are named but no format " \
        "is given" in nameless.stderr
    assert "  overrides (quantize.components, quantize.format): quantize: vae: no " \
        "linear layer matches" in vae.stderr
    for done in (nameless, vae):
        assert "wan-tiny.yaml:1" not in done.stderr and "Traceback" not in done.stderr


def test_the_library_s_overrides_are_named_as_overrides():
    """``porter.load``'s overrides are no command line: a problem they make is said to
    be in the overrides, as one made on the command line is."""
    with pytest.raises(RecipeError) as raised:
        porter.load(WAN, "generate.stpes=4")
    assert "overrides: generate.stpes: unknown key" in str(raised.value)
