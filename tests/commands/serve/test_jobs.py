"""The job queue behind ``porter serve``, on a real tiny port in this process: a job the
machine has no memory for now is refused when submitted and fails when it starts,
instead of the kernel killing the server; a cancel takes effect before the next stage
and is kept on disk, so a server that stops first never runs the job again."""

import json
import time

import pytest

import porter
from porter.commands.serve import jobs as jobs_mod
from porter.generate import stages
from porter.runtime import memory

from support import TINY_RECIPE

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    path = tmp_path_factory.mktemp("jobs") / "tiny.yaml"
    path.write_text(TINY_RECIPE)
    with porter.load(path) as loaded:
        yield loaded


def finished(jobs, job_id, seconds=300):
    deadline = time.time() + seconds
    while time.time() < deadline:
        job = jobs.get(job_id)
        if job.status in jobs_mod.FINISHED:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} stuck: {job.to_dict()}")


def test_a_job_the_machine_cannot_hold_now_is_refused_or_fails_at_its_start(
        port, tmp_path, monkeypatch):
    """The scores of this size take a few MiB; with less free than that and the margin,
    a job that would start now is refused (503). One that waits behind another is
    taken (what the jobs before it hold will be free by then) and checked when it
    starts, where it fails if the room is still not there, with the same message."""
    jobs = jobs_mod.Jobs(port, tmp_path)
    scarce = memory.Limit(2**20, "the machine's available memory (MemAvailable)")
    monkeypatch.setattr(memory, "device_free", lambda devices: scarce)
    with pytest.raises(jobs_mod.NoRoom) as refused:
        jobs.submit({"prompt": "a fox", "frames": 17})
    assert jobs_mod.refused_status(refused.value) == 503
    assert "not enough memory free now" in refused.value.message
    assert "1.00 MiB now (set by the machine's available memory" in refused.value.message
    assert jobs.list() == []  # nothing queued
    monkeypatch.undo()
    first = jobs.submit({"prompt": "a fox"})  # room enough: taken
    monkeypatch.setattr(memory, "device_free", lambda devices: scarce)
    second = jobs.submit({"prompt": "a hare"})  # behind the first: taken
    jobs.start()
    try:
        failed = [finished(jobs, job.id) for job in (first, second)]
    finally:
        jobs.shutdown()
    assert [job.status for job in failed] == ["failed", "failed"]
    assert all("not enough memory free now" in job.error for job in failed)


def test_a_cancel_while_encoding_stops_before_denoising_and_is_kept_on_disk(
        port, tmp_path, monkeypatch):
    jobs = jobs_mod.Jobs(port, tmp_path)
    seen = {}
    encode = stages.encode

    def cancelled_while_encoding(port_, call):
        job_id = call.directory.name
        seen["job"] = jobs.cancel(job_id).to_dict()
        seen["on_disk"] = json.loads((call.directory / jobs_mod.JOB).read_text())
        return encode(port_, call)

    monkeypatch.setattr(stages, "encode", cancelled_while_encoding)
    job = jobs.submit({"prompt": "a fox"})
    jobs.start()
    try:
        done = finished(jobs, job.id)
    finally:
        jobs.shutdown()
    assert seen["job"]["status"] == "running" and seen["job"]["cancelling"]
    assert seen["on_disk"]["status"] == "running" and seen["on_disk"]["cancelling"]
    assert done.status == "cancelled" and done.step == 0  # no denoising step ran
    folder = tmp_path / "jobs" / job.id
    assert (folder / "encode.safetensors").exists()
    assert not (folder / "denoise.safetensors").exists()
    assert not list(folder.glob("progress-*"))
    assert json.loads((folder / jobs_mod.JOB).read_text())["cancelling"] is False


def test_a_job_cancelled_when_its_server_stopped_is_not_run_again(port, tmp_path):
    """A server killed (for memory, say) after a cancel and before the job stopped left
    it ``running`` with ``cancelling`` on disk: the next server ends it cancelled."""
    folder = tmp_path / "jobs" / "000001"
    folder.mkdir(parents=True)
    (folder / jobs_mod.JOB).write_text(json.dumps({
        "id": "000001", "seq": 1, "status": "running", "settings": {"prompt": "a fox"},
        "submitted": 1.0, "started": 2.0, "step": 3, "steps": 40, "cancelling": True}))
    jobs = jobs_mod.Jobs(port, tmp_path)
    job = jobs.get("000001")
    assert job.status == "cancelled" and job.error == "cancelled at step 3"
    assert jobs.state()["queued"] == 0
    saved = json.loads((folder / jobs_mod.JOB).read_text())
    assert saved["status"] == "cancelled" and saved["cancelling"] is False


def test_a_cancel_while_decoding_lets_the_job_finish_and_the_next_run(
        port, tmp_path, monkeypatch):
    """A cancel that comes after the job's last stage began lets it finish; its stop
    does not reach the next job."""
    jobs = jobs_mod.Jobs(port, tmp_path)
    first, second = (jobs.submit({"prompt": p}) for p in ("one", "two"))
    decode = stages.decode

    def cancelled_while_decoding(port_, call, latents):
        if call.directory.name == first.id:
            jobs.cancel(first.id)  # too late to stop: nothing is left after it
        return decode(port_, call, latents)

    monkeypatch.setattr(stages, "decode", cancelled_while_decoding)
    jobs.start()
    try:
        assert finished(jobs, first.id).status == "done"
        assert finished(jobs, second.id).status == "done"
    finally:
        jobs.shutdown()
