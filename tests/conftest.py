"""Test setup: 8 virtual CPU devices and a private compile cache.

Both must be in the environment before anything imports JAX.
"""

import os
import sys
import tempfile

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("PORTER_CACHE_DIR", tempfile.mkdtemp(prefix="porter-test-cache-"))

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/models: tiny pipelines
RECIPES = ROOT / "recipes"


def pytest_collection_modifyitems(config, items):
    """Files with heavy tests first (most first), then the others by their number of
    tests (what xdist's own reordering does; pyproject.toml turns that off for this).
    A worker grows as it runs tests (about 6 GiB each after half the suite: compiled
    programs, imported pipelines); a real-size run beside two grown workers came
    within 1 GiB of the machine's 24 (measured), so heavy tests run while the workers
    are small. Within a file the order stays as written."""
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def order(tests):
        heavy = sum(t.get_closest_marker("heavy") is not None for t in tests)
        return (-heavy, -len(tests))

    items[:] = [item for tests in sorted(files.values(), key=order) for item in tests]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test marked heavy has the machine's memory to itself across the xdist
    workers of a run, from its fixtures' set-up to their tear-down: it holds a
    lock exclusively, every other test holds it shared. A real-size run on 8
    virtual devices peaks near 11 GiB by itself; beside the other worker's tests
    it was killed for memory (CI, stop 34).

    A turnstile keeps a waiting heavy test from starving behind a stream of
    light ones: a light test passes it before taking its shared lock, and a
    heavy test holds it until its exclusive lock is granted."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        yield
        return
    import fcntl

    base = Path(tempfile.gettempdir()) / f"porter-heavy-{run}"
    heavy = item.get_closest_marker("heavy") is not None
    with open(f"{base}.turnstile", "w") as turnstile, open(f"{base}.lock", "w") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if heavy:
            fcntl.flock(lock, fcntl.LOCK_EX)  # waits for the light test beside it
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        else:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
            fcntl.flock(lock, fcntl.LOCK_SH)
        yield  # both released when the files close


@pytest.fixture
def write(tmp_path):
    """Write a text file under tmp_path and return its path."""
    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path
    return _write


TINY_RECIPE = """\
model: {family: wan, source: tiny}
generate:
  prompt: "a cat"
  height: 32
  width: 32
  frames: 9
  steps: 3
  max_sequence_length: 16
"""


def diffusers_latents(recipe):
    """Final latents of the plain diffusers WanPipeline (tiny weights) for a recipe."""
    import torch
    from porter_wan.tiny import build_pipeline

    gen = recipe.generate
    pipe = build_pipeline()
    for module in (pipe.transformer, pipe.vae, pipe.text_encoder):
        module.eval()
    return pipe(gen.prompt, negative_prompt=gen.negative_prompt, height=gen.height,
                width=gen.width, num_frames=gen.frames, num_inference_steps=gen.steps,
                guidance_scale=gen.guidance_scale, max_sequence_length=gen.max_sequence_length,
                generator=torch.Generator().manual_seed(gen.seed), output_type="latent").frames


def lowered_text(module, runtime, **inputs) -> str:
    """StableHLO of a compiled (torchax) module's forward for these keyword inputs."""
    import functools

    import jax
    from porter.shims.compat import import_torchax

    interop = import_torchax().interop
    with runtime.env:
        fn = interop.jax_view(functools.partial(module.functional_call, "forward"))
        return jax.jit(fn, static_argnames=("return_dict",)).lower(
            interop.jax_view(module.params), interop.jax_view(module.buffers),
            return_dict=False, **interop.jax_view(inputs)).as_text()


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


class Positions(torch.nn.Module):
    """A module adding its input to positions a caller made on the host (a pipeline's
    ``torch.arange(n)``): what crosses into a compiled program with no device."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, x, positions):
        return x + self.scale * positions
