"""Where the compile cache lives, and a moved cache still hits."""

from porter.runtime import compile_cache


def test_cache_dir_settings(monkeypatch, tmp_path):
    monkeypatch.delenv("PORTER_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.directory(True) == tmp_path / "porter" / "jax-compile"
    assert compile_cache.directory(False) is None
    assert compile_cache.directory(str(tmp_path / "x")) == tmp_path / "x"
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "env"))
    assert compile_cache.directory(False) == tmp_path / "env"


MOVED_CACHE = """\
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from porter.runtime import compile_cache
compile_cache.enable(Path(sys.argv[1]))
jax.jit(lambda x: jnp.sin(x) * 3)(jnp.arange(4.0)).block_until_ready()
"""


def test_a_moved_compile_cache_still_hits(tmp_path):
    """A cache directory copied (or moved) elsewhere serves its programs there: the
    key of an entry does not depend on the directory's path (on CPU and TPU)."""
    import shutil
    import subprocess
    import sys

    def run(directory):
        return subprocess.run([sys.executable, "-c", MOVED_CACHE, str(directory)],
                              capture_output=True, text=True, check=True)

    run(tmp_path / "a")
    entries = {p.name for p in (tmp_path / "a").glob("*-cache")}
    assert entries
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    run(tmp_path / "b")
    # a miss would have written a new entry under another key
    assert {p.name for p in (tmp_path / "b").glob("*-cache")} == entries
