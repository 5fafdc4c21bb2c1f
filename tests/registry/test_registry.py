import sys

import pytest

from porter import registry as registry_mod
from porter.registry import PluginError

from support.plugins import EXTERNAL, make_dist


def test_builtin_plugins_found_through_entry_points():
    registry = registry_mod.load()
    assert {"wan", "cogvideox", "hunyuan"} <= set(registry.plugins)
    assert registry.owners[("family", "wan")] == "wan"
    assert registry.registered_by("wan") == ["family wan", "patch wan.rope_cache",
                                            "patch wan.vae_decode_scan",
                                            "patch wan.vae_encode_scan"]
    assert "patch core.report_compiling" in registry.registered_by("core")


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("ext_")]:
        del sys.modules[name]


def test_out_of_repo_plugin_is_discovered(site):
    make_dist(site, "ext_toy", EXTERNAL)
    registry = registry_mod.load()
    assert "ext_toy" in registry.plugins
    assert registry.family("toy").summary == "a family from outside the repository"
    assert registry.owners[("family", "toy")] == "ext_toy"


def test_mistyped_hook_is_an_error(site):
    make_dist(site, "ext_typo", """
        from porter import hookimpl

        @hookimpl
        def porter_register_familes(register):
            pass
    """)
    with pytest.raises(PluginError) as info:
        registry_mod.load()
    assert "porter_register_familes" in info.value.message
    assert "ext_typo" in info.value.message


def test_duplicate_family_rejected(site):
    make_dist(site, "ext_dup", """
        from porter import hookimpl
        from porter_wan.family import WanFamily

        @hookimpl
        def porter_register_families(register):
            register(WanFamily())
    """)
    with pytest.raises(PluginError, match="already registered by"):
        registry_mod.load()


def test_plugin_failing_at_import(site):
    make_dist(site, "ext_broken", "raise RuntimeError('boom')\n")
    with pytest.raises(PluginError, match="boom"):
        registry_mod.load()


def test_unknown_family_lists_known():
    from porter.errors import UsageError
    with pytest.raises(UsageError, match="registered: cogvideox, generic, hunyuan, wan"):
        registry_mod.load().family("nope")


def test_the_core_plugin_missing_or_taken_is_an_error(monkeypatch):
    """The core's plugin comes through its entry point ``core``: where it does not (porter
    on the path without being installed, an install older than the entry point) no run
    would have an attention backend or the core's patches; where another package's
    ``core`` took its place the same. Both say so and how to fix it."""
    import types

    import pluggy

    monkeypatch.setattr(pluggy.PluginManager, "load_setuptools_entrypoints",
                        lambda self, group: 0)
    with pytest.raises(PluginError, match="'core' .* is missing") as info:
        registry_mod.load()
    assert "pip install" in info.value.hint
    impostor = types.ModuleType("ext_core")
    monkeypatch.setattr(pluggy.PluginManager, "load_setuptools_entrypoints",
                        lambda self, group: self.register(impostor, name="core"))
    with pytest.raises(PluginError, match="taken by 'ext_core'"):
        registry_mod.load()
