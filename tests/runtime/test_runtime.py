"""The JAX side of a run: the mesh, virtual CPU devices, the platform."""

import os

import pytest

from porter import runtime
from porter.errors import UsageError
from porter.runtime import environment


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
