"""A port held across processes, 2 processes x 4 CPU devices (gloo over loopback).
``porter serve``: process 0 takes HTTP requests, both run each job in step; jobs equal
a one-process run, a cancel reaches both, SIGTERM to process 0 ends both cleanly, and
a killed process 1 fails the running job with a message the client reads and ends
the server with an error. The library: ``porter.load`` in each process, the same
calls, the latents of one process."""

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from safetensors.torch import load_file

from porter import recipe, registry as registry_mod
from porter.commands.run import run

from support import RECIPES
from support.processes import slow_porter
from support.serving import TOKEN, free_port, wait_for

# Not heavy: two tiny-model processes, as tests/e2e/test_multiprocess.py's
pytestmark = pytest.mark.slow

RECIPE = RECIPES / "wan-tiny-tp.yaml"  # dp=2 x tp=4: every job's collectives span both
#: each denoising step sleeps 0.5 s, so that a cancel or a kill lands mid-job
SLOW_PORTER = slow_porter("FlowMatchEulerDiscreteScheduler")


class TwoProcesses:
    """`porter serve RECIPE` as processes 0 and 1 of 2, 4 CPU devices each; a client of
    process 0's HTTP API."""

    def __init__(self, out, heartbeat_s: int = 20):
        coordinator, self.port = free_port(), free_port()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PORTER_TOKEN": TOKEN,
               "PORTER_SERVE_HEARTBEAT_S": str(heartbeat_s)}
        self.logs = [open(out.parent / f"{out.name}-{i}.log", "w") for i in range(2)]
        self.children = [subprocess.Popen(
            [sys.executable, "-c", SLOW_PORTER, "serve", str(RECIPE), f"output.dir={out}",
             "--port", str(self.port), "--cpu-devices", "4", "--coordinator",
             f"127.0.0.1:{coordinator}", "--num-processes", "2", "--process-id", str(i)],
            stdout=log, stderr=subprocess.STDOUT, env=env) for i, log in enumerate(self.logs)]
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30,
                                   headers={"Authorization": f"Bearer {TOKEN}"})
        deadline = time.time() + 300
        while time.time() < deadline:
            assert all(c.poll() is None for c in self.children), self.output(0)
            try:
                if self.client.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.5)
        raise AssertionError("the server did not start: " + self.output(0))

    def output(self, process: int) -> str:
        if not self.logs[process].closed:
            self.logs[process].flush()
        return open(self.logs[process].name).read()

    def submit(self, **settings) -> str:
        answer = self.client.post("/jobs", json=settings)
        assert answer.status_code == 201, answer.text
        return answer.json()["id"]

    def wait(self, job_id, step=None, seconds=300):
        # often: a failed job is answered for a few seconds before the server stops
        try:
            return wait_for(self.client, job_id, step=step, seconds=seconds, every=0.1)
        except httpx.TransportError as exc:  # process 0 is gone: say what each printed
            codes = [child.poll() for child in self.children]
            # process 0's last (a failed run shows the end of its message)
            raise AssertionError(f"process 0 stopped answering ({exc}); exit codes "
                                 f"{codes}\n--- process 1:\n{self.said(1)[-2000:]}\n"
                                 f"--- process 0:\n{self.said(0)[-4000:]}") from exc

    def said(self, process: int) -> str:
        """What a process printed, without gloo's connection lines."""
        return "\n".join(line for line in self.output(process).splitlines()
                         if not line.startswith("[Gloo]"))

    def ended(self, seconds=120) -> list:
        """Both processes' exit codes (waiting for each)."""
        try:
            return [child.wait(timeout=seconds) for child in self.children]
        finally:
            self.close()

    def close(self) -> None:
        for child in self.children:
            child.kill()
        self.client.close()
        for log in self.logs:
            log.close()


def latents(out, job_id):
    return load_file(str(out / "jobs" / job_id / "denoise.safetensors"))["latents"]


def test_jobs_across_two_processes_equal_one_process_and_a_cancel_reaches_both(tmp_path):
    out = tmp_path / "out"
    server = TwoProcesses(out)
    try:
        fox = {"prompt": "a red fox", "seed": 5, "steps": 2}
        first = server.submit(**fox)
        assert server.wait(first)["status"] == "done", server.output(0)[-3000:]

        # a cancel on process 0 stops both at the same step; they go on in step
        long = server.submit(prompt="a slow job", steps=12)
        server.wait(long, step=2)
        assert server.client.delete(f"/jobs/{long}").status_code == 200
        cancelled = server.wait(long)
        assert cancelled["status"] == "cancelled" and cancelled["step"] < 12, cancelled
        again = server.submit(**fox)
        assert server.wait(again)["status"] == "done", server.output(0)[-3000:]
        health = server.client.get("/health").json()
        assert health["status"] == "ok" and health["error"] is None

        server.children[0].send_signal(signal.SIGTERM)  # process 0 stops: both end
        codes = server.ended()
    finally:
        server.close()
    follower = server.output(1)
    assert codes == [0, 0], (server.output(0)[-3000:], follower[-3000:])
    assert "process 0 stopped the server" in follower

    single = run(recipe.load(RECIPE, [f"output.dir={tmp_path / 'one'}", "generate.steps=2",
                                      "generate.prompt=a red fox", "generate.seed=5"]),
                 registry_mod.loaded(), progress=False)
    assert single.data["mesh"] == {"dp": 2, "tp": 4}
    # gloo sums tensor-parallel partial results in another order than one process
    # does: float32 rounding (tests/e2e/test_multiprocess.py)
    bound = 1e-5 * single.latents.abs().max().item()
    for job in (first, again):
        assert (latents(out, job) - single.latents).abs().max().item() <= bound
    record = json.loads((out / "jobs" / first / "run.json").read_text())
    assert record["device"]["count"] == 8 and record["device"]["processes"] == 2


def test_a_killed_process_fails_the_running_job_and_ends_the_server(tmp_path):
    out = tmp_path / "out"
    # short enough to wait for, long enough that a busy machine (the CI's other worker
    # compiling beside two processes on two cores) does not starve a live heartbeat
    # past it: at 3 s, CI runs twice lost the server before the kill
    server = TwoProcesses(out, heartbeat_s=10)
    try:
        job = server.submit(prompt="a long job", steps=40)
        server.wait(job, step=2)
        server.children[1].kill()  # its host died
        failed = server.wait(job, seconds=60)
        refused = server.client.post("/jobs", json={"prompt": "one more"})
        codes = server.ended()
    finally:
        server.close()
    leader = server.output(0)
    assert failed["status"] == "failed", failed
    assert failed["error"].startswith("process 1 of 2 stopped answering"), failed
    assert refused.status_code == 503 and "process 1 of 2" in refused.json()["error"]
    assert codes[0] == 1, leader[-3000:]
    assert "error: the server stopped: process 1 of 2 stopped answering" in leader
    assert "Terminating process" not in leader  # JAX's own end of every process
    saved = json.loads((out / "jobs" / job / "job.json").read_text())
    assert saved["status"] == "failed" and "process 1 of 2" in saved["error"]


def test_a_signal_to_process_1_stops_both_at_a_step_and_ends_the_server(tmp_path):
    """SIGTERM to process 1 mid-job (a scheduler stopping one host): both stop after the
    same step, the job keeps its checkpoint and stays queued for the next start, and
    the server ends naming the process and the signal."""
    out = tmp_path / "out"
    server = TwoProcesses(out)
    try:
        job = server.submit(prompt="a long job", steps=40)
        server.wait(job, step=2)
        server.children[1].send_signal(signal.SIGTERM)
        codes = server.ended()
    finally:
        server.close()
    leader = server.output(0)
    assert codes == [1, 143], (leader[-3000:], server.output(1)[-3000:])
    assert "error: the server stopped: process 1 of 2 left: stopped by signal 15" in leader
    saved = json.loads((out / "jobs" / job / "job.json").read_text())
    assert saved["status"] == "queued" and saved["error"] is None, saved
    assert list((out / "jobs" / job).glob("progress-*.json")), "no checkpoint kept"


#: Source of one process of a Python program that holds a port across processes: each
#: process loads the same recipe under JAX's multi-controller runtime (its settings in
#: the environment) and makes the same call; process 0 keeps the latents.
LIBRARY = """\
import sys
import porter
from safetensors.torch import save_file
port = porter.load(sys.argv[1], cpu_devices=4)
made = port.generate(prompt="a red fox", seed=5, steps=2)
assert made.record["device"]["processes"] == 2, made.record["device"]
if sys.argv[2] == "0":
    save_file({"latents": made.latents.contiguous()}, sys.argv[3])
"""


def test_the_library_holds_a_port_across_processes(tmp_path):
    coordinator = free_port()
    saved = tmp_path / "latents.safetensors"
    children = [subprocess.Popen(
        [sys.executable, "-c", LIBRARY, str(RECIPE), str(i), str(saved)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{coordinator}",
             "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(i)}) for i in range(2)]
    for child in children:
        _, stderr = child.communicate(timeout=600)
        assert child.returncode == 0, stderr[-3000:]
    single = run(recipe.load(RECIPE, [f"output.dir={tmp_path / 'one'}", "generate.steps=2",
                                      "generate.prompt=a red fox", "generate.seed=5"]),
                 registry_mod.loaded(), progress=False)
    made = load_file(str(saved))["latents"]
    assert (made - single.latents).abs().max().item() <= \
        1e-5 * single.latents.abs().max().item()
