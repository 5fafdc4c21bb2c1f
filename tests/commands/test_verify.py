"""porter verify: parity per block, and a planted fault is found where it was planted."""

import json

import pytest
import torch

from porter import cli, registry as registry_mod, recipe
from porter.commands.verify import _check_matches, verify
from porter.errors import RecipeError

from support import RECIPES, TINY_RECIPE


def test_tiny_port_matches_pytorch_block_by_block():
    result = verify(recipe.load(RECIPES / "wan-tiny.yaml"), registry_mod.loaded())
    assert result["ok"] and result["first_over_tolerance"] is None
    assert [row["module"] for row in result["modules"]] == ["blocks.0", "blocks.1"]
    assert all(row["max_rel"] <= 1e-5 for row in result["modules"])
    assert result["output"]["max_rel"] <= 1e-5


def test_a_pattern_that_names_no_module_is_said_with_the_names_there_are():
    with pytest.raises(RecipeError) as refused:
        verify(recipe.load(RECIPES / "wan-tiny.yaml", ["verify.modules=block"]),
               registry_mod.loaded())
    [problem] = refused.value.problems
    assert problem.path == "verify.modules" and "'block'" in problem.message
    assert "blocks, " in problem.hint and problem.hint.endswith("blocks.0")
    # the default pattern (Wan's) is no refusal where a family names its blocks
    # otherwise: the output is still compared
    other = torch.nn.Module()
    other.transformer_blocks = torch.nn.ModuleList([torch.nn.Linear(1, 1)])
    _check_matches(recipe.load(RECIPES / "cogvideox-tiny.yaml"), other)


def test_planted_dtype_fault_is_localised(write, capsys):
    """blocks.1 alone is cast to float16: verify must name blocks.1, not blocks.0."""
    path = write("fault.yaml", TINY_RECIPE + r"""
dtypes:
  overrides:
    transformer: [{match: 'blocks\.1\..*', dtype: float16}]
""")
    result = verify(recipe.load(path), registry_mod.loaded())
    rows = {row["module"]: row for row in result["modules"]}
    assert rows["blocks.0"]["ok"] and not rows["blocks.1"]["ok"]
    assert result["first_over_tolerance"] == "blocks.1"
    assert not result["ok"]
    code = cli.main(["verify", str(path)])
    out = capsys.readouterr().out
    assert code == 3 and "first module over tolerance: blocks.1" in out


@pytest.mark.slow
def test_sharded_against_unsharded_json(capsys):
    code = cli.main(["verify", str(RECIPES / "wan-tiny-tp.yaml"), "--sharded", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["ok"] and data["against"] == "unsharded port"
    assert data["output"]["max_rel"] <= 1e-5
