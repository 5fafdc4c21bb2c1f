"""Whether a module defines a name, read from its source without importing it
(``porter.shims.defined``): what `validate` and `porter patches` check a patch's target
with before they import anything."""

import json
import subprocess
import sys
import textwrap

from porter.shims.defined import defined

SOURCE = '''
import os
from pathlib import Path as P

LIMIT = 3
count: int = 0
declared_only: int
GONE = 1
del GONE

def function():
    pass

class Base:
    def inherited(self):
        pass

class Child(Base):
    scale = 2.0
    field: float

    def method(self):
        pass

    def __hidden(self):
        pass

    async def waiting(self):
        pass

if os.environ.get("NEVER_SET"):
    def sometimes():
        pass

Alias = Child
'''


def _package(tmp_path, monkeypatch, name: str):
    """A package ``name`` with a submodule ``models`` holding SOURCE, on the path; its
    ``__init__`` raises, so that reading the submodule must not run it."""
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("raise RuntimeError('the package was imported')\n")
    (root / "models.py").write_text(textwrap.dedent(SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}.models"


def test_what_the_source_states_is_read_without_importing(tmp_path, monkeypatch):
    module = _package(tmp_path, monkeypatch, "readonly_pkg")
    for path in ("function", "Child", "Child.method", "Child.waiting", "Child.scale",
                 "LIMIT", "count", "os", "P", "Alias"):
        assert defined(module, path) is True, path
    assert module not in sys.modules and "readonly_pkg" not in sys.modules


def test_what_the_source_cannot_tell_is_left_to_an_import(tmp_path, monkeypatch):
    """Inherited, conditional, missing, under an alias, annotated without a value,
    deleted, renamed by Python (``__hidden``), in a file that does not parse, or no
    source at all: None, so that the caller imports and looks (and a missing target
    is reported from there)."""
    module = _package(tmp_path, monkeypatch, "unsure_pkg")
    for path in ("Child.inherited", "sometimes", "missing", "Child.missing",
                 "Alias.method", "declared_only", "Child.field", "GONE",
                 "Child.__hidden"):
        assert defined(module, path) is None, path
    (tmp_path / "unsure_pkg" / "broken.py").write_text("def f(:\n")
    assert defined("unsure_pkg.broken", "f") is None
    assert defined("unsure_pkg.nothing_here", "name") is None
    assert defined("no_such_package_anywhere.models", "name") is None
    assert defined("json", "dumps") is None  # imported already: the caller looks


PATCHES = """
import json, sys
from porter import registry
from porter.shims.defined import defined

found = {}
for name, patch in sorted(registry.load().patches.items()):
    module, _, path = patch.target.partition(":")
    found[name] = defined(module, path)
imported = sorted(m for m in ("torch", "diffusers", "torchax") if m in sys.modules)
for patch in registry.load().patches.values():
    patch.locate()  # every target exists: what the read said True of is there
print(json.dumps({"read": found, "imported": imported}))
"""


def test_every_model_patch_is_read_from_its_source():
    """In a fresh process: the families' patches (and the core's that recipes name)
    are found by reading alone, nothing imported to find them; every target the read
    answers exists when imported. The core's patches of torchax's views stay unread:
    their methods are inherited from torch's tensor, which only an import can see."""
    done = subprocess.run([sys.executable, "-c", PATCHES], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["imported"] == []
    read = found["read"]
    assert all(value in (True, None) for value in read.values()), read
    family = [name for name in read if not name.startswith("core.")]
    assert family and all(read[name] is True for name in family), read
    assert read["core.report_compiling"] is True
    assert {name for name, value in read.items() if value is None} == {
        "core.view_index", "core.view_of_view", "core.view_tolist"}
