"""TPU slices as Cloud TPU names them, and what a machine without libtpu is told."""

import pytest

from porter.aot import targets
from porter.errors import UsageError

from support import RECIPES
from support.aot import needs_libtpu
from support.processes import user_porter


def test_targets_as_tpu_users_name_them():
    assert targets.named("v5litepod-8") is targets.named("v5e-8")
    for name, chips in (("v4-8", 4), ("v5e-8", 8), ("v5p-8", 4), ("v6e-8", 8),
                        ("v5e-16", 16), ("v6e-16", 16)):
        target = targets.named(name)
        assert target.chips == chips and target.facts.source.startswith("https://")
    with pytest.raises(UsageError, match="unknown target 'v6e-9'") as refused:
        targets.named("v6e-9")
    assert "did you mean 'v6e-8'" in refused.value.hint


def test_without_libtpu_compile_says_what_to_install(monkeypatch):
    from porter.errors import UsageError

    monkeypatch.setattr(targets, "libtpu_missing", lambda: "libtpu is not installed")
    with pytest.raises(UsageError) as info:
        targets.devices(targets.named("v6e-8"))
    assert "pip install 'porter[tpu]'" in info.value.hint


@needs_libtpu
def test_a_mesh_larger_than_the_target_is_refused():
    out = user_porter("compile", str(RECIPES / "wan14b.yaml"), "--target", "v5p-8")
    assert out.returncode == 2
    assert "needs 8 devices but v5p-8 has 4 chips" in out.stderr
