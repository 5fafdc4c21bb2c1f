"""Plugin discovery (entry-point group ``porter``) and the registry of names.

Built-in plugins are found exactly like third-party ones: through their
package's entry points. The registry records which plugin registered each name.
"""

from __future__ import annotations

import difflib

from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import pluggy

from porter.errors import PorterError, UsageError
from porter.registry import hookspecs
from porter.shims.patch import Patch

if TYPE_CHECKING:
    from porter.families.base import ModelFamily

ENTRY_POINT_GROUP = "porter"


class PluginError(PorterError):
    """A plugin could not be loaded or registered something invalid."""


@dataclass
class Registry:
    families: dict = field(default_factory=dict)  # name -> ModelFamily
    patches: dict = field(default_factory=dict)  # name -> porter.shims.patch.Patch
    attention: dict = field(default_factory=dict)  # name -> AttentionBackend
    owners: dict = field(default_factory=dict)  # (kind, name) -> plugin name
    plugins: list[str] = field(default_factory=list)

    def _add(self, kind: str, store: dict, item, *, plugin: str) -> None:
        name = getattr(item, "name", None)
        if not isinstance(name, str) or not name:
            raise PluginError(f"plugin {plugin!r} registered a {kind} without a name",
                              hint="give it a name = '...'")
        if name in store:
            raise PluginError(
                f"plugin {plugin!r} registered {kind} {name!r}, already registered by "
                f"{self.owners[(kind, name)]!r}", hint=f"{kind} names must be unique")
        store[name] = item
        self.owners[(kind, name)] = plugin

    def add_family(self, family: ModelFamily, *, plugin: str) -> None:
        if getattr(family, "staged", None) not in (True, False):
            raise PluginError(
                f"plugin {plugin!r} registered family {getattr(family, 'name', family)!r} "
                "with no way to generate", hint="subclass porter.families.base.StagedFamily (the "
                "core's loop) or porter.families.generic.GenericFamily (the pipeline's own)")
        self._add("family", self.families, family, plugin=plugin)

    def add_patch(self, patch, *, plugin: str) -> None:
        if not isinstance(patch, Patch):
            raise PluginError(f"plugin {plugin!r} registered {patch!r}, not a porter Patch")
        self._add("patch", self.patches, patch, plugin=plugin)

    def add_attention(self, backend, *, plugin: str) -> None:
        if backend.name == "auto":
            raise PluginError(f"plugin {plugin!r}: 'auto' is reserved for automatic choice")
        self._add("attention", self.attention, backend, plugin=plugin)

    def family(self, name: str):
        if name not in self.families:
            known = ", ".join(sorted(self.families)) or "none"
            near = difflib.get_close_matches(name, list(self.families), n=1)
            raise UsageError(f"unknown model family {name!r} (registered: {known})",
                             hint=f"did you mean {near[0]!r}?" if near else
                             "install the plugin that provides it; `porter plugins` "
                             "lists what is loaded")
        return self.families[name]

    def registered_by(self, plugin: str) -> list[str]:
        return [f"{kind} {name}" for (kind, name), owner in self.owners.items()
                if owner == plugin]


def _manager(extra_plugins) -> pluggy.PluginManager:
    manager = pluggy.PluginManager(ENTRY_POINT_GROUP)
    manager.add_hookspecs(hookspecs)
    try:
        # the core's own plugin (porter.registry.builtin, entry point "core") too: it
        # imports the families and backends it registers, so nothing here imports it
        manager.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        for plugin in extra_plugins:
            manager.register(plugin)
        manager.check_pending()
    except pluggy.PluginValidationError as exc:
        name = manager.get_name(exc.plugin) or getattr(exc.plugin, "__name__", "?")
        raise PluginError(f"plugin {name!r}: {exc}",
                          hint="hook names and arguments are listed in porter/registry/hookspecs.py"
                          ) from None
    except Exception as exc:  # a plugin failing at import time
        raise PluginError(f"a plugin failed to load: {type(exc).__name__}: {exc}",
                          hint="run with --debug for the traceback") from exc
    _check_core(manager)
    return manager


#: the core's own plugin, registered through porter's entry point ``core``
CORE = "porter.registry.builtin"


def _check_core(manager: pluggy.PluginManager) -> None:
    """The core's plugin is the one named ``core``: without it no run has an attention
    backend, the generic family or the core's patches (porter installed without its
    entry points, from a checkout on the path or an install older than the entry
    point), and another package's ``core`` would take its place unseen."""
    found = manager.get_plugin("core")
    if getattr(found, "__name__", None) == CORE:
        return
    what = "is missing" if found is None else \
        f"is taken by {getattr(found, '__name__', found)!r}, not {CORE}"
    raise PluginError(f"Porter's own plugin (entry point 'core' in group "
                      f"{ENTRY_POINT_GROUP!r}) {what}",
                      hint="install porter with pip (`pip install -e .` in a checkout, "
                           "again after an update) so its entry points are registered")


def load(extra_plugins=()) -> Registry:
    """Load every installed plugin (plus ``extra_plugins``) and collect registrations."""
    manager = _manager(extra_plugins)
    registry = Registry()
    registry.plugins = sorted(name for name, _ in manager.list_name_plugin())
    hooks = ((manager.hook.porter_register_families, registry.add_family),
             (manager.hook.porter_register_patches, registry.add_patch),
             (manager.hook.porter_register_attention, registry.add_attention))
    for hook, add in hooks:
        for impl in hook.get_hookimpls():
            impl.function(register=partial(add, plugin=impl.plugin_name))
    return registry


_cached: Registry | None = None


def loaded() -> Registry:
    """The process-wide registry, loaded on first use."""
    global _cached
    if _cached is None:
        _cached = load()
    return _cached
