"""torchax on torch releases without named-dimension overloads."""

import sys

import torch
from torch._ops import OpOverloadPacket

from porter.shims import compat

TORCH_HAS_NAMED_OVERLOADS = hasattr(torch.ops.aten.prod, "dim_Dimname")


def test_torchax_imports_and_computes():
    torchax = compat.import_torchax()
    env = torchax.default_env()
    with env:
        x = torch.arange(6, dtype=torch.float32).reshape(2, 3).to("jax")
        result = (x * 2).sum(dim=1)
    assert result.jax().tolist() == [6.0, 24.0]
    # the shim was used exactly when this torch lacks the overloads
    assert bool(compat.replaced_overloads) == (not TORCH_HAS_NAMED_OVERLOADS)


def test_getattr_restored_after_tolerant_import():
    original = OpOverloadPacket.__getattr__
    with compat.tolerate_removed_overloads():
        assert OpOverloadPacket.__getattr__ is not original
    assert OpOverloadPacket.__getattr__ is original


def test_only_named_dimension_overloads_are_tolerated():
    with compat.tolerate_removed_overloads():
        placeholder = torch.ops.aten.prod.made_up_Dimname
        assert isinstance(placeholder, compat.RemovedOverload)
        try:
            torch.ops.aten.prod.made_up_overload
        except AttributeError:
            pass
        else:
            raise AssertionError("a missing ordinary overload must still raise")


def test_stays_out_of_the_way_when_plain_import_works(tmp_path, monkeypatch):
    (tmp_path / "works_fine.py").write_text("import torch\nVALUE = torch.ops.aten.sum.default\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    compat.replaced_overloads.clear()
    module = compat.import_tolerant(("works_fine",))
    assert module.VALUE is torch.ops.aten.sum.default
    assert compat.replaced_overloads == []
    sys.modules.pop("works_fine", None)


def test_retries_only_for_removed_overload_errors(tmp_path, monkeypatch):
    (tmp_path / "needs_shim.py").write_text(
        "import torch\nTABLE = {torch.ops.aten.prod.gone_Dimname: 1}\n")
    (tmp_path / "broken.py").write_text("raise AttributeError('something else')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = compat.import_tolerant(("needs_shim",))
    assert compat.replaced_overloads == ["aten.prod.gone_Dimname"]
    assert isinstance(next(iter(module.TABLE)), compat.RemovedOverload)
    try:
        compat.import_tolerant(("broken",))
    except AttributeError as exc:
        assert "something else" in str(exc)
    else:
        raise AssertionError("unrelated import errors must propagate")
    for name in ("needs_shim", "broken"):
        sys.modules.pop(name, None)
