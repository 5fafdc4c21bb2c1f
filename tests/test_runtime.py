import os

import pytest

from porter.runtime import compile_cache, environment, xla
from porter import runtime
from porter.errors import UsageError


def test_resolve_mesh_fills_auto():
    assert runtime.resolve_mesh({"dp": "auto", "tp": 2}, 8) == {"dp": 4, "tp": 2}
    assert runtime.resolve_mesh({"dp": 1}, 8) == {"dp": 1}


def test_mesh_larger_than_devices_is_a_usage_error():
    with pytest.raises(UsageError) as info:
        runtime.resolve_mesh({"dp": 2, "tp": 8}, 8)
    assert "needs 16 devices but 8 exist" in info.value.message
    assert "--cpu-devices" in info.value.hint


def test_virtual_cpu_devices_from_test_environment():
    import jax
    assert jax.device_count() == 8  # set by conftest before JAX was imported


def test_cpu_devices_after_jax_started_is_refused():
    import jax
    jax.devices()  # JAX reads the device count now, not at import
    environment.request_cpu_devices(8)  # what JAX already has: fine
    with pytest.raises(UsageError, match="after JAX started"):
        environment.request_cpu_devices(4)


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


def test_request_cpu_devices_sets_flag_before_import(monkeypatch):
    import subprocess
    import sys
    code = ("from porter.runtime import environment; environment.request_cpu_devices(3); "
            "import jax; print(jax.device_count())")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "3"


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


def test_peak_memory_is_the_process_own_not_its_parents():
    """ru_maxrss survives exec: a run started by a large process (a test worker that
    ran pipelines in-process) reported the worker's size as its own peak."""
    import subprocess
    import sys

    big = bytearray(1 << 30)
    big[::4096] = b"\1" * len(big[::4096])  # resident
    code = "from porter.runtime.memory import own_peak_rss; print(own_peak_rss())"
    peak = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True).stdout)
    assert peak < len(big) // 2


def test_platform_takes_effect_when_jax_was_imported_first():
    """JAX reads JAX_PLATFORMS at import; a recipe's runtime.platform must reach it
    anyway (code that imported JAX before Porter: the CPU side of a GPU parity run
    once ran on the GPU)."""
    import subprocess
    import sys
    code = ("import jax; from porter import runtime; runtime.configure('cpu', None); "
            "print(jax.config.jax_platforms, jax.default_backend())")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True)
    assert out.stdout.split()[-2:] == ["cpu", "cpu"]


def test_another_platform_after_jax_started_is_refused():
    import jax
    jax.devices()
    running = jax.default_backend()
    environment.request_platform(running)  # what JAX runs on: fine
    other = "tpu" if running != "tpu" else "cpu"
    with pytest.raises(UsageError, match=f"{other} was asked for after JAX started on "
                                         f"{running}"):
        environment.request_platform(other)
