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


def test_libtpus_fiber_stack_is_set_unless_the_environment_sets_it(monkeypatch):
    """libtpu reads LIBTPU_INIT_ARGS when it starts: Porter adds its fibers' stack to
    what the user gave, and keeps the user's own stack size where one is given (with
    one dash or two); with no libtpu it sets nothing."""
    from porter.runtime import environment

    monkeypatch.setattr(environment, "libtpu_installed", lambda: True)
    monkeypatch.setattr(environment, "_libtpu_started", lambda: False)
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_example=1")
    environment.roomy_libtpu_stacks()
    assert os.environ["LIBTPU_INIT_ARGS"] == (
        f"--xla_tpu_example=1 --{environment.FIBER_STACK_FLAG}={8 << 20}")
    for given in (f"--{environment.FIBER_STACK_FLAG}=1024",
                  f"-{environment.FIBER_STACK_FLAG}=1024 --xla_tpu_example=1"):
        monkeypatch.setenv("LIBTPU_INIT_ARGS", given)
        environment.roomy_libtpu_stacks()
        assert os.environ["LIBTPU_INIT_ARGS"] == given
    monkeypatch.delenv("LIBTPU_INIT_ARGS")
    monkeypatch.setattr(environment, "_libtpu_started", lambda: True)  # too late
    environment.roomy_libtpu_stacks()
    assert "LIBTPU_INIT_ARGS" not in os.environ
    monkeypatch.setattr(environment, "_libtpu_started", lambda: False)
    monkeypatch.setattr(environment, "libtpu_installed", lambda: False)
    environment.roomy_libtpu_stacks()
    assert "LIBTPU_INIT_ARGS" not in os.environ
