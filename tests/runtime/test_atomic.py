"""Files written whole or not at all: writers never share a temporary name, a failed write
leaves nothing, a full disk names the file being written."""

import threading

import pytest

from porter.runtime import atomic

from support import RECIPES
from support.filesystems import PORTER, in_small_filesystem, needs_namespaces
from support.processes import FULL_DISK, porter_process

pytestmark = pytest.mark.slow


def test_writers_never_share_a_temporary_name(tmp_path):
    target = tmp_path / "run.json"
    assert len({atomic.temporary(target) for _ in range(100)}) == 100
    payloads = [bytes([i]) * 200_000 for i in range(8)]
    threads = [threading.Thread(target=atomic.write_bytes, args=(target, p))
               for p in payloads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert target.read_bytes() in payloads  # one writer's file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    target = tmp_path / "video.mp4"
    monkeypatch.setattr("os.replace", full)
    with pytest.raises(OSError):
        atomic.write_bytes(target, b"x" * 1000)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["encode.safetensors", "progress-000001.json", "run.json"])
def test_a_full_disk_names_the_file_being_written(tmp_path, name):
    """write() on a full disk raises ENOSPC naming no file: the message said
    'No space left on device: ?'. It names the file a stage, a checkpoint or the
    record was being written to, with what to do."""
    out = tmp_path / "out"
    done = porter_process(name, "run", str(RECIPES / "wan-tiny.yaml"), "generate.steps=2",
                          "output.checkpoint_every=1", f"output.dir={out}", "--no-progress",
                          script=FULL_DISK)
    assert done.returncode == 2, done.stderr
    assert f"error: No space left on device writing {out / name}\n" in done.stderr
    assert "the disk is full" in done.stderr and "output.dir" in done.stderr
    assert "?" not in done.stderr.split("error:")[-1]
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
    assert not list(out.glob(".*.partial"))


@needs_namespaces
def test_a_full_disk_is_an_environment_error(tmp_path):
    out = tmp_path / "mnt" / "out"
    done = in_small_filesystem(tmp_path, f"{PORTER} run {RECIPES / 'wan-tiny.yaml'} "
                               f"generate.steps=1 output.dir={out} --no-progress", "size=8k")
    assert done.returncode == 2, done.stderr
    assert "No space left on device" in done.stderr and "the disk is full" in done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
