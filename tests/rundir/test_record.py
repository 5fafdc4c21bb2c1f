"""run.json: Porter's source, the environment and the checkpoint a run was made from."""

import hashlib
import os

import pytest

from porter import registry as registry_mod
from porter.commands.run import run

from support import RECIPES
from support.runs import tiny_recipe

pytestmark = pytest.mark.slow


def test_the_record_names_source_environment_and_checkpoint(saved_tiny, tmp_path):
    result = run(tiny_recipe(tmp_path, tmp_path / "out", saved_tiny), registry_mod.loaded(),
                 progress=False)
    data = result.data
    assert data["environment"]["XLA_FLAGS"] == os.environ.get("XLA_FLAGS")
    assert data["environment"]["xla_options"]
    if (RECIPES.parent / ".git").exists():
        assert len(data["porter_source"]["commit"]) == 40
    files = data["checkpoint"]["files"]
    weights = saved_tiny / "transformer" / "diffusion_pytorch_model.safetensors"
    with open(weights, "rb") as f:
        header = f.read(int.from_bytes(f.read(8), "little"))
    assert files["transformer/diffusion_pytorch_model.safetensors"]["header_sha256"] == \
        hashlib.sha256(header).hexdigest()
    assert "model_index.json" in files
