"""JAX's compile cache, guarded: unreadable or swapped entries are replaced, a full or
read-only disk costs a warning, a path that is a file too."""

import json
import shutil
import sys

import pytest
import torch

from porter.runtime import compile_cache

from support import RECIPES
from support.filesystems import PORTER, in_small_filesystem, needs_namespaces
from support.processes import porter_process

pytestmark = pytest.mark.slow


def test_a_cache_path_that_is_a_file_warns_and_the_run_goes_on(tmp_path):
    (tmp_path / "cache").write_text("a file")
    done = porter_process("run", str(RECIPES / "wan-tiny.yaml"), "generate.steps=1",
                          f"output.dir={tmp_path / 'out'}", "--no-progress",
                          env={"PORTER_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr
    assert "warning: the compile cache at" in done.stderr
    assert "continuing without it" in done.stderr
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["compile_cache"] is None
    assert any("compile cache" in w for w in record["warnings"])


def cached_run_into(cache, out):
    """A one-step tiny Wan run by `porter run` in a fresh process, compiling into (or
    loading from) the compile cache ``cache``; its process."""
    return porter_process("run", str(RECIPES / "wan-tiny.yaml"), "generate.steps=1",
                          f"output.dir={out}", "--no-progress",
                          env={"PORTER_CACHE_DIR": str(cache)})


@pytest.fixture(scope="module")
def filled_cache(tmp_path_factory):
    """A compile cache one run filled (JAX's entries and Porter's stored traces) and
    that run's output directory: each test damages its own copy (a copied cache hits
    as the original does: tests/runtime/test_runtime.py)."""
    directory = tmp_path_factory.mktemp("filled")
    done = cached_run_into(directory / "cache", directory / "out")
    assert done.returncode == 0, done.stderr
    return directory / "cache", directory / "out"


def copy_cache(filled_cache, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(filled_cache[0], cache)
    return cache


def test_unreadable_jax_cache_entries_are_replaced(tmp_path, filled_cache):
    """0-byte and cut entries (what JAX's in-place writes leave on a full disk) are
    removed with a warning and stored anew, whole."""
    cache = copy_cache(filled_cache, tmp_path)
    entries = sorted(cache.glob("*-cache"))
    assert entries
    entries[0].write_bytes(b"")
    entries[1].write_bytes(entries[1].read_bytes()[:100])
    damaged = cached_run_into(cache, tmp_path / "out")
    assert damaged.returncode == 0, damaged.stderr
    assert "removed an unreadable compile cache entry" in damaged.stderr
    assert sorted(p.name for p in cache.glob("*-cache")) == [p.name for p in entries]
    from jax._src import compilation_cache
    for entry in entries[:2]:  # stored anew, whole: what JAX reads back
        assert compilation_cache.decompress_executable(entry.read_bytes())
    assert not list(cache.glob(".*.partial"))


def test_swapped_jax_cache_entries_are_replaced_and_the_traces_kept(tmp_path, filled_cache):
    """Two JAX cache entries with their contents exchanged. JAX trusts the file name:
    it loaded the other program, every later run exited 1 (``safe_zip()``) and the
    trace cache threw away its healthy entry for it. Each entry's seal names its key:
    the two are removed, compiled again and stored anew, the stored traces kept."""
    from safetensors.torch import load_file

    cache = copy_cache(filled_cache, tmp_path)
    latents = load_file(str(filled_cache[1] / "denoise.safetensors"))["latents"]
    traces = {p.name: p.read_bytes() for p in (cache / "porter-traces").glob("*.exported")}
    first, second = sorted(cache.glob("*-cache"), key=lambda p: p.stat().st_size)[-2:]
    a, b = first.read_bytes(), second.read_bytes()  # two programs of the model
    first.write_bytes(b)
    second.write_bytes(a)
    done = cached_run_into(cache, tmp_path / "second")
    assert done.returncode == 0, done.stderr
    again = load_file(str(tmp_path / "second" / "denoise.safetensors"))["latents"]
    assert done.stderr.count("removed a compile cache entry that is not its key's") == 2
    assert "discarded a stored traced program" not in done.stderr
    assert torch.equal(latents, again)
    assert {p.name: p.read_bytes()
            for p in (cache / "porter-traces").glob("*.exported")} == traces
    for entry in (first, second):  # stored anew, each under its own key
        assert compile_cache._unseal(entry.name.removesuffix("-cache"), entry.read_bytes())[0]
    compiled = json.loads((tmp_path / "second" / "run.json").read_text())["timings"]["compile"]
    # the text encoder, the transformer and the streamed decode's three programs
    assert (compiled["cache_misses"], compiled["traces_loaded"]) == (2, 5)


SAME_SIGNATURE = """\
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from porter.runtime import compile_cache

compile_cache.enable(Path(sys.argv[1]))


@jax.jit
def double(x):
    return x * 2


@jax.jit
def triple(x):
    return x * 3


print(double(jnp.arange(3.0)).tolist(), triple(jnp.arange(3.0)).tolist())
"""


def test_swapped_jax_cache_entries_of_one_signature_never_run(tmp_path):
    """Two programs taking the same arguments: swapped, JAX alone silently runs the
    other one (``double`` gives 3x). Their seals refuse them."""
    cache = tmp_path / "cache"
    first = porter_process(str(cache), script=SAME_SIGNATURE)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split("\n")[-2] == "[0.0, 2.0, 4.0] [0.0, 3.0, 6.0]"
    (double,), (triple,) = cache.glob("jit_double-*"), cache.glob("jit_triple-*")
    a, b = double.read_bytes(), triple.read_bytes()
    double.write_bytes(b)
    triple.write_bytes(a)
    swapped = porter_process(str(cache), script=SAME_SIGNATURE)
    assert swapped.returncode == 0, swapped.stderr
    assert swapped.stdout == first.stdout
    assert swapped.stderr.count("removed a compile cache entry that is not its key's") == 2


@needs_namespaces
def test_a_full_cache_disk_warns_and_leaves_no_empty_entries(tmp_path):
    cache = tmp_path / "mnt"
    command = (f"PORTER_CACHE_DIR={cache} {PORTER} run {RECIPES / 'wan-tiny.yaml'} "
               f"generate.steps=1 output.dir={tmp_path / 'out'} --no-progress && "
               f"find {cache} -type f -size -1 | wc -l")
    done = in_small_filesystem(tmp_path, command, "size=256k")
    assert done.returncode == 0, done.stderr
    assert "cannot be written" in done.stderr and "continuing without" in done.stderr
    assert done.stdout.strip().splitlines()[-1] == "0"  # no 0-byte entry left


@needs_namespaces
def test_a_read_only_compile_cache_is_left_unused_with_a_warning(tmp_path):
    check = (f"{sys.executable} -c 'from pathlib import Path; from porter.runtime import "
             f"compile_cache; print(compile_cache.usable(Path(\"{tmp_path / 'mnt'}\")))'")
    done = in_small_filesystem(tmp_path, check, "ro")
    assert done.stdout.strip() == "False", done.stderr
    assert "Read-only file system" in done.stderr and "continuing without it" in done.stderr
