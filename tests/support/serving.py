"""``porter serve`` in a fresh process on loopback, for the server's tests (its API,
OpenAI's client, the page in a browser)."""

import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from support import ROOT

TOKEN = "s3cret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FINISHED = ("done", "failed", "cancelled")


def wait_for(client, job_id, until=FINISHED, step=None, seconds=300, every=0.2) -> dict:
    """The job, once its status is in ``until`` (or it has done ``step`` steps)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        job = client.get(f"/jobs/{job_id}").json()
        if job["status"] in until or (step is not None and job["step"] >= step):
            return job
        time.sleep(every)
    raise AssertionError(f"job {job_id} stuck: {job}")


class Server:
    """``porter serve`` in a fresh process, and a client that carries the token."""

    def __init__(self, recipe, out, queue=2, *options):
        self.port = free_port()
        self.log = open(out.parent / f"serve-{self.port}.log", "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "porter.cli", "serve", str(recipe), f"output.dir={out}",
             "--port", str(self.port), "--queue", str(queue), *options],
            cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
            env={**os.environ, "PORTER_TOKEN": TOKEN})
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(base_url=self.url, timeout=30,
                                   headers={"Authorization": f"Bearer {TOKEN}"})
        deadline = time.time() + 300
        while time.time() < deadline:
            assert self.process.poll() is None, self.output()
            try:
                if self.client.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.5)
        raise AssertionError("the server did not start: " + self.output())

    def output(self) -> str:
        self.log.flush()
        return open(self.log.name).read()

    def wait(self, job_id, until=FINISHED, step=None, seconds=300):
        return wait_for(self.client, job_id, until, step, seconds)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=120)
        self.client.close()
        self.log.close()
        return code
