"""XLA compiler options: the platform's defaults, the recipe's, refused by XLA itself."""

import pytest

from porter.errors import UsageError
from porter.runtime import xla


def test_xla_options_platform_defaults_recipe_override_and_refusal(monkeypatch):
    import jax
    platform = jax.default_backend()
    defaults = xla.DEFAULT_XLA_OPTIONS.get(platform, {})
    assert xla.options(None, platform) == defaults  # this jaxlib knows them
    assert xla.options({}, platform) == {}  # a recipe can turn them off
    wanted = {"xla_cpu_enable_fast_math": False}
    assert xla.options(wanted, platform) == wanted
    with pytest.raises(UsageError) as info:
        xla.options({"xla_cpu_no_such_option": True}, platform)
    assert "runtime.xla_options" in info.value.message
    assert "xla_cpu_no_such_option" in info.value.message
    # defaults an older XLA does not know are dropped, not an error
    monkeypatch.setitem(xla.DEFAULT_XLA_OPTIONS, platform,
                        {"xla_cpu_no_such_option": 1, **wanted})
    assert xla.options(None, platform) == wanted
