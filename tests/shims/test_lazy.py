"""A library imported at a module's first use of it (``porter.shims.lazy``)."""

import copy
import sys
import threading
import types

from porter.shims import lazy


def _owner(monkeypatch, name: str) -> types.ModuleType:
    owned = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, name, owned)
    owned.json = lazy.module("json", name)
    owned.alias = owned.json  # two names for one stand-in: both become the library
    return owned


def test_the_first_use_puts_the_library_in_the_stand_ins_place(monkeypatch):
    owned = _owner(monkeypatch, "lazy_owner_once")
    assert "imported at its first use in lazy_owner_once" in repr(owned.json)
    assert owned.json.dumps([1]) == "[1]"
    assert owned.json is sys.modules["json"] and owned.alias is sys.modules["json"]


def test_threads_resolving_at_once_see_the_library(monkeypatch):
    owned = _owner(monkeypatch, "lazy_owner_threads")
    stand_in, seen = owned.json, []
    threads = [threading.Thread(target=lambda: seen.append(stand_in.loads("2")))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == [2] * 8 and owned.json is sys.modules["json"]


def test_special_names_and_an_unregistered_owner_import_nothing_by_themselves():
    stand_in = lazy.module("json", "an_owner_never_registered")
    copied = copy.copy(stand_in)  # asks for __reduce_ex__ and friends: no import, no loop
    assert repr(copied) == repr(stand_in)
    assert stand_in.dumps({}) == "{}"  # resolves; no module to put it in
