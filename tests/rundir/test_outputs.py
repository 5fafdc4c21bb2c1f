"""A run owns its directory: a second run into it is refused naming the holder, a killed
holder leaves no lock; what cannot be written fails before loading."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from porter.rundir import outputs
from porter.runtime import atomic

from support import RECIPES
from support.filesystems import PORTER, in_small_filesystem, needs_namespaces
from support.processes import porter_process, slow_porter
from support.runs import RECIPE

pytestmark = pytest.mark.slow


def test_a_busy_directory_is_refused_naming_the_holder(tmp_path):
    """A second `porter run` into a directory a run is writing exits 2 at once, naming
    the holder; the first run's video and record stay one pair."""
    out = tmp_path / "out"
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.format(source="tiny", out=out))
    first = subprocess.Popen([sys.executable, "-c", slow_porter("FlowMatchEulerDiscreteScheduler"),
                              "run", str(path), "--no-progress"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / outputs.LOCK).exists() or not (out / outputs.LOCK).read_text():
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    second = porter_process("run", str(path), "generate.seed=1", "--no-progress")
    assert second.returncode == 2, second.stderr
    assert f"{out} is in use by porter run, pid {first.pid} on" in second.stderr
    assert "Traceback" not in second.stderr
    _, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr
    record = json.loads((out / "run.json").read_text())
    assert record["seed"] == 0
    assert record["outputs"]["files"]["video.mp4"] == atomic.sha256(out / "video.mp4")


def test_a_killed_holder_leaves_no_stuck_lock(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from pathlib import Path\nfrom porter.rundir import outputs\n"
                               "with outputs.owned(Path(sys.argv[1])):\n"
                               "    print('held', flush=True); time.sleep(300)",
                               str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(outputs.Busy, match=f"pid {holder.pid}"):
        with outputs.owned(tmp_path):
            pass
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with outputs.owned(tmp_path):  # the kernel dropped the lock with the process
        assert f"pid {os.getpid()}" in (tmp_path / outputs.LOCK).read_text()


@needs_namespaces
def test_a_read_only_output_dir_fails_before_loading(tmp_path):
    out = tmp_path / "mnt" / "out"
    done = in_small_filesystem(tmp_path, f"{PORTER} run {RECIPES / 'wan-tiny.yaml'} "
                               f"output.dir={out}", "ro")
    assert done.returncode == 2, done.stderr
    assert "Read-only file system" in done.stderr and "read-only" in done.stderr
    assert "loading" not in done.stderr  # found before any weight


def test_an_output_dir_the_system_will_not_create_is_the_users_problem():
    """/proc refuses a new folder with "no such file": the path's problem (exit 2, the
    system's words, a hint), not an internal error."""
    from porter.errors import UsageError

    with pytest.raises(UsageError) as refused:
        outputs.prepare(Path("/proc/porter-cannot-make-this"))
    assert "cannot write the output directory: No such file or directory" in \
        refused.value.render() and "give output.dir a folder" in refused.value.render()


def test_an_output_dir_that_is_a_file_fails_before_loading(tmp_path):
    (tmp_path / "file").write_text("x")
    done = porter_process("run", str(RECIPES / "wan-tiny.yaml"),
                          f"output.dir={tmp_path / 'file' / 'out'}")
    assert done.returncode == 2, done.stderr
    assert "cannot write the output directory" in done.stderr and "hint:" in done.stderr
    assert "loading" not in done.stderr
