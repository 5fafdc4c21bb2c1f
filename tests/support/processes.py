"""The porter command in new processes, as users and schedulers run it: fresh, with
nothing imported; interrupted; on a full disk."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace


#: the JAX and libtpu settings of the tests' own processes, which a user's shell has not
TESTS_ONLY = ("XLA_FLAGS", "JAX_PLATFORMS", "LIBTPU_INIT_ARGS")


def user_porter(*args, timeout=600, env=None):
    """The porter command as a user's shell runs it: a new process, nothing imported,
    no JAX or libtpu settings in the environment (the tests' own are removed): one CPU
    device."""
    base = {k: v for k, v in os.environ.items() if k not in TESTS_ONLY}
    return subprocess.run([sys.executable, "-m", "porter.cli", *map(str, args)],
                          capture_output=True, text=True, env={**base, **(env or {})},
                          timeout=timeout)


#: the porter command run for each argv (a JSON list, the first argument) in turn, in one
#: process: what each printed and returned, as a JSON list on stdout
_IN_ONE_PROCESS = """\
import contextlib, io, json, sys
from porter.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    results.append({"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
sys.__stdout__.write(json.dumps(results))
"""


def porter_calls(*argvs, env=None, timeout=600, user=True) -> list:
    """Each ``argv`` run by the porter command in turn in one new process, nothing
    imported before the first: checks that differ only in their arguments share what
    the process imports. ``user``: as a user's shell runs it (one CPU device), else in
    the tests' environment. Each result has returncode, stdout and stderr."""
    base = {k: v for k, v in os.environ.items() if not user or k not in TESTS_ONLY}
    done = subprocess.run([sys.executable, "-c", _IN_ONE_PROCESS,
                           json.dumps([[str(a) for a in argv] for argv in argvs])],
                          capture_output=True, text=True, env={**base, **(env or {})},
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return [SimpleNamespace(**result) for result in json.loads(done.stdout)]


def porter_process(*args, env=None, script=None, timeout=600):
    """`porter ARGS` in a new process with nothing imported first, in the tests'
    environment (8 virtual CPU devices); ``script``: the source it runs instead of
    ``python -m porter.cli`` (which ends by calling it)."""
    command = [sys.executable, "-c", script, *map(str, args)] if script else \
        [sys.executable, "-m", "porter.cli", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def interrupt_at_step(monkeypatch, scheduler, step: int) -> None:
    """``scheduler.step`` raises a real SIGINT in this process at its ``step``-th call
    (that step finishes, is saved, the run stops); ``monkeypatch.undo()`` or the end of
    the test puts it back."""
    import signal

    original, calls = scheduler.step, []

    def signalled(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == step:
            signal.raise_signal(signal.SIGINT)
        return original(self, *args, **kwargs)
    monkeypatch.setattr(scheduler, "step", signalled)


def terminate_after(child, path: Path, seconds: float) -> str:
    """SIGTERM to ``child`` once ``path`` exists (a checkpoint written); its stderr."""
    import signal
    import time

    deadline = time.monotonic() + seconds
    while not path.exists():
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, f"no {path.name} within {seconds} s"
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    return child.communicate(timeout=120)[1]


def slow_porter(scheduler: str) -> str:
    """Source of a child process that runs the porter CLI with ``scheduler``'s step
    slowed down, so a signal sent after a checkpoint lands mid-denoising."""
    return f"""\
import functools, sys, time
import diffusers
step = diffusers.{scheduler}.step
@functools.wraps(step)  # the same signature: pipelines pass what it names (generator)
def slow(self, *args, **kwargs):
    time.sleep(0.5)
    return step(self, *args, **kwargs)
diffusers.{scheduler}.step = slow
from porter.cli import main
sys.exit(main(sys.argv[1:]))
"""


#: Source of a child process that runs the porter CLI on a disk that is full for one
#: file: the first argument is part of its name; writing it fails with ENOSPC.
FULL_DISK = """\
import builtins, errno, sys

opened = builtins.open


class Full:
    '''A file on a disk that is full: write() fails as the kernel's does, naming no
    file.'''
    def __init__(self, handle):
        self.handle = handle

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")


def full_open(file, mode="r", *args, **kwargs):
    handle = opened(file, mode, *args, **kwargs)
    return Full(handle) if "w" in mode and FULL in str(file) else handle


FULL = sys.argv.pop(1)  # the file whose writes fail
builtins.open = full_open
from porter.cli import main
sys.exit(main(sys.argv[1:]))
"""
