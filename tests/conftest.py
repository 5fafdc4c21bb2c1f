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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/support, models, matrix

from support import RECIPES  # noqa: E402


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


@pytest.fixture(scope="session")
def saved_tiny(tmp_path_factory):
    """The tiny Wan pipeline as save_pretrained writes it: a local checkpoint."""
    from porter_wan.tiny import build_pipeline

    directory = tmp_path_factory.mktemp("saved-wan")
    build_pipeline().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def recipe_path(tmp_path_factory):
    """The tiny Wan recipe the step-cache tests run (guided, rotary tables precomputed)."""
    path = tmp_path_factory.mktemp("cache") / "tiny.yaml"
    path.write_text("""\
model: {family: wan, source: tiny}
generate: {prompt: "a cat", height: 32, width: 32, frames: 9, steps: 3,
           guidance_scale: 5.0, max_sequence_length: 16}
rotary: {precompute: true}
""")
    return path


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A folder with the hostile neighbours a recipe may point at."""
    root = tmp_path_factory.mktemp("hostile")
    (root / "base.yaml").write_text((RECIPES / "wan-base.yaml").read_text())
    os.mkfifo(root / "fifo")  # open() blocks until someone writes
    (root / "loop_a").symlink_to(root / "loop_b")
    (root / "loop_b").symlink_to(root / "loop_a")
    (root / "subdir").mkdir()
    return root


@pytest.fixture(scope="module")
def warm():
    """Start JAX (8 CPU devices, from conftest) and import the models once, so that
    time bounds measure validation, not first imports; and a hostile
    runtime.platform cannot change which platform JAX starts. A module whose tests are
    timed asks for it: ``pytestmark = pytest.mark.usefixtures("warm")``."""
    import jax

    from support import hostile

    assert jax.device_count() == 8
    for name in hostile.SEEDS:
        assert hostile.porter_validate(RECIPES / name) == 0
