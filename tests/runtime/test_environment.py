"""What JAX reads when it starts: the virtual CPU device count set before it starts."""

import os


def test_request_cpu_devices_sets_flag_before_import(monkeypatch):
    import subprocess
    import sys
    code = ("from porter.runtime import environment; environment.request_cpu_devices(3); "
            "import jax; print(jax.device_count())")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "3"
