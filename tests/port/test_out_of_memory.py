"""Out of memory is the machine refusing: exit 2 with the estimate, classified from what
JAX and Python raise, foreseen by validate where it can be."""

import os
import subprocess
import sys

import pytest

from porter import registry as registry_mod

from support import RECIPES
from support.processes import porter_process
from support.runs import tiny_recipe

pytestmark = pytest.mark.slow


def address_space_limited(gib: int) -> list[str]:
    """A command prefix running a program under `ulimit -v` (the shell sets it: a
    preexec_fn would run Python in a fork of this process's JAX threads)."""
    return ["sh", "-c", f'ulimit -v {gib << 20} && exec "$0" "$@"', sys.executable]


def test_a_run_out_of_memory_exits_2_with_the_estimate(tmp_path):
    """Memory that shrinks after the checks (here: the process's address space, capped
    once its prompt is encoded at what it maps then and 1 GiB more): denoising's 2.64
    GiB of attention scores cannot be allocated, and the run exits 2 with the estimate
    and what to change, not an internal error. Validate cannot foresee this; a limit
    set before the run starts it refuses (below)."""
    import re
    import resource
    import time

    out = tmp_path / "out"
    run = subprocess.Popen(
        [sys.executable, "-m", "porter.cli", "run", str(RECIPES / "wan-tiny.yaml"),
         "mesh.dp=1", "mesh.tp=1", "attention.backend=reference", "generate.frames=49",
         "generate.height=512", "generate.width=512", "generate.steps=1",
         f"output.dir={out}", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # glibc reserves address space per thread arena: as few on any core count, so
        # that compiling fits in the 1 GiB
        env={**os.environ, "PORTER_CACHE_DIR": str(tmp_path / "cache"),
             "MALLOC_ARENA_MAX": "2"})
    try:
        deadline = time.monotonic() + 300
        while not (out / "encode.safetensors").exists():
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "the run never encoded its prompt"
            time.sleep(0.05)
        with open(f"/proc/{run.pid}/status") as status:
            mapped = next(int(line.split()[1]) * 1024 for line in status
                          if line.startswith("VmSize:"))
        cap = mapped + (1 << 30)
        resource.prlimit(run.pid, resource.RLIMIT_AS, (cap, cap))
        _, stderr = run.communicate(timeout=600)
    finally:
        run.kill()
    assert run.returncode == 2, stderr
    assert "error: out of memory running the model (" in stderr
    # what failed is the scores' allocation (gigabytes), not the compiler's
    asked = re.search(r"allocating (\d+) bytes", stderr)
    assert asked and int(asked.group(1)) >= 2**30, stderr
    assert ("estimated per device: weights 296.68 KiB and self-attention scores 1.32 GiB "
            "per layer, kept twice (scores and softmax): about 2.64 GiB, of the ") in stderr
    assert "a device has (set by the address-space limit RLIMIT_AS" in stderr
    assert "attention.backend: blockwise or auto" in stderr
    assert "generate.height, width or frames" in stderr
    assert "internal error" not in stderr and "Traceback" not in stderr
    assert not (out / "video.mp4").exists()


def test_out_of_memory_is_classified_from_what_jax_and_python_raise(tmp_path):
    """The exception JAX raises (JaxRuntimeError, RESOURCE_EXHAUSTED: 256 TiB cannot be
    mapped, whatever the machine overcommits), a MemoryError, either as the cause of
    another error: OutOfMemory, exit 2, with the plan's estimate. Other errors pass."""
    import jax
    import jax.numpy as jnp

    from porter.errors import OutOfMemory, is_out_of_memory
    from porter.port import out_of_memory
    loaded = tiny_recipe(tmp_path, tmp_path / "out", "tiny", "attention.backend=blockwise")
    with pytest.raises(jax.errors.JaxRuntimeError) as raised:
        jnp.zeros((2**46,), jnp.float32).block_until_ready()
    assert "RESOURCE_EXHAUSTED" in str(raised.value)
    wrapped = RuntimeError("a step failed")
    wrapped.__cause__ = raised.value
    for exc in (raised.value, MemoryError(), wrapped):
        assert is_out_of_memory(exc)
        with pytest.raises(OutOfMemory) as refused:
            with out_of_memory.explained(loaded, registry_mod.loaded()):
                raise exc
        assert refused.value.exit_code == 2 and refused.value.__cause__ is exc
        assert "estimated per device: weights" in refused.value.message
        assert "attention scores" in refused.value.message
        assert "(blocks)" in refused.value.message
        assert "attention.backend" not in refused.value.hint  # already blockwise
    assert "RESOURCE_EXHAUSTED: Out of memory" in str(out_of_memory.refused(
        raised.value, loaded, registry_mod.loaded()))
    for other in (RuntimeError("shapes do not match"), ValueError("out of memory")):
        assert not is_out_of_memory(other)
        with pytest.raises(type(other)):
            with out_of_memory.explained(loaded, registry_mod.loaded()):
                raise other


def test_attention_too_large_for_the_device_fails_validate(capsys, monkeypatch):
    """Wan 1.3B at 480x832, 81 frames, on one 64 GiB device: with every score
    materialised (reference: float32, 96 GiB per layer) it cannot fit; blockwise can."""
    from porter import cli
    from porter.runtime import memory
    monkeypatch.setattr(memory, "device_memory",
                        lambda devices: memory.Limit(64 * 2**30, "the machine's memory"))
    code = cli.main(["validate", str(RECIPES / "wan1.3b.yaml"), "mesh.dp=1", "mesh.tp=1",
                     "attention.backend=reference"])
    err = capsys.readouterr().err
    assert code == 2 and "self-attention scores at this size take 95.95 GiB" in err
    assert "more than the 64.00 GiB a device has" in err and "blockwise" in err
    assert cli.main(["validate", str(RECIPES / "wan1.3b.yaml"), "mesh.dp=1", "mesh.tp=1",
                     "attention.backend=blockwise"]) == 0


BIG_ATTENTION = ("validate", str(RECIPES / "wan-tiny.yaml"), "mesh.dp=1", "mesh.tp=1",
                 "attention.backend=reference", "generate.frames=65",
                 "generate.height=512", "generate.width=512")  # scores x 2: 4.52 GiB


def test_attention_beyond_the_address_space_limit_fails_validate(tmp_path):
    """A process under `ulimit -v` (6 GiB) on a machine with more: validate compares
    with what it may still map (the limit, less what the process maps already and a
    margin for what a run maps beside its arrays), and says which limit that is. The
    4.52 GiB of scores are under the 6 GiB, but not under what is left of them."""
    from porter.runtime import memory

    done = subprocess.run([*address_space_limited(6), "-m", "porter.cli", *BIG_ATTENTION],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "about 4.52 GiB, more than the " in done.stderr
    assert ("a device has (set by the address-space limit RLIMIT_AS, `ulimit -v`: 6.00 "
            "GiB, less the ") in done.stderr
    assert "GiB this process mapped before loading and 1 GiB a run maps beside its " \
        "arrays)" in done.stderr
    if memory.host_limit().bytes > 5 << 30:  # without the limit, the same recipe fits
        assert porter_process(*BIG_ATTENTION).returncode == 0
