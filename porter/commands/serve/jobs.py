"""The job queue behind ``porter serve``: one port, jobs run one at a time in
submission order, every job kept on disk.

Each job is a folder ``<output.dir>/jobs/<id>/`` holding ``job.json`` (its
settings and status) and, once it runs, a run directory's files (stages,
checkpoints, video, ``run.json``). A server started again on the same folder
serves the finished jobs and queues the unfinished ones again in their order;
the one that was running continues from its last checkpoint.
"""

from __future__ import annotations

import collections
import json
import math
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from porter.commands.serve import uploads
from porter.errors import Interrupted, UsageError, failure
from porter.port import checks
from porter.generate import preview, runners
from porter.generate.call import Call
from porter.rundir import outputs, record
from porter.runtime import atomic, interrupt, monitor, notices

if TYPE_CHECKING:
    from porter.recipe import Recipe
    from porter.registry import Registry

JOB = "job.json"
#: a job's input files (images, videos), in its folder (``porter.commands.serve.uploads``)
INPUTS = "inputs"
#: a submitted job's input files while its settings are checked
STAGING = ".incoming-"
#: what a job can be; queued and running jobs are picked up again after a restart
FINISHED = ("done", "failed", "cancelled")
#: seconds a server whose port lost a process waits for the running job to end (its
#: collectives may wait for the missing process for ever)
LOST_JOIN_S = 10


class QueueFull(UsageError):
    """The queue holds as many jobs as it may: ``retry_after`` is when to try again, in
    whole seconds (the last finished job's run time: about when the next ends)."""

    def __init__(self, message: str, retry_after: int, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.retry_after = retry_after


class Conflict(UsageError):
    """The job is not in a state that allows this."""


class Closing(UsageError):
    """The server is shutting down."""


class NoRoom(UsageError):
    """The machine cannot give the job the memory it needs now (other processes hold
    it): the same job, submitted again later, may run."""


def refused_status(exc: Exception) -> int | None:
    """The HTTP status a refusal of ``Jobs.submit`` answers with (None: not one of its
    refusals): a full queue 429, a server shutting down or short of memory now 503,
    settings that cannot run (RecipeError, UsageError) 400, the server's disk refusing
    the job's files 507."""
    if isinstance(exc, QueueFull):
        return 429
    if isinstance(exc, (Closing, NoRoom)):
        return 503
    if isinstance(exc, UsageError):  # RecipeError is one
        return 400
    if isinstance(exc, OSError):
        return 507
    return None


def refused_headers(exc: Exception) -> dict:
    """The headers a refusal of ``Jobs.submit`` answers with: a full queue says when to
    try again (``Retry-After``)."""
    return {"Retry-After": str(exc.retry_after)} if isinstance(exc, QueueFull) else {}


class Job:
    def __init__(self, id: str, seq: int, settings: dict, **state):
        self.id, self.seq, self.settings = id, seq, settings
        self.status = state.get("status", "queued")
        self.submitted = state.get("submitted", time.time())
        self.started = state.get("started")
        self.finished = state.get("finished")
        self.error = state.get("error")
        self.step, self.steps = state.get("step", 0), state.get("steps")
        self.resumed = state.get("resumed", 0)  # times it continued after a stop
        #: asked to stop while running; kept on disk, so a server that stops before the
        #: job does never runs it again
        self.cancelling = state.get("cancelling", False)

    def to_dict(self) -> dict:
        return {"id": self.id, "seq": self.seq, "status": self.status,
                "settings": self.settings, "submitted": self.submitted,
                "started": self.started, "finished": self.finished, "error": self.error,
                "step": self.step, "steps": self.steps, "resumed": self.resumed,
                "cancelling": self.cancelling}


class Jobs:
    """Submitted jobs and the worker thread that runs them on ``port``. With
    ``followers`` (``porter.commands.serve.hosts.Followers``), a port that spans several
    processes: each run is handed to the others as it starts, and the server ends
    when one of them is gone (``lost``)."""

    def __init__(self, port, directory: Path, max_queue: int = 16, say=None,
                 inputs: Path | None = None, warmups: tuple = (), followers=None):
        self.port, self.max_queue = port, max_queue
        self.followers = followers
        #: why the server cannot go on (a process of its port is gone), once it cannot
        self.broken: str | None = None
        #: told when it cannot: the HTTP server stops (``serve``)
        self.on_broken = None
        if followers is not None:
            followers.on_lost = self.lost
        #: recipes (``serve.warmup``'s, checked) run before any job; then ready
        self.warmups = list(warmups)
        self.warmed: list[dict] = []  # each warm-up's settings, seconds and compilation
        #: the process's age when it became ready (at once without warm-ups)
        self.ready_s: float | None = None if self.warmups else monitor.process_seconds() or 0.0
        self.directory = Path(directory) / "jobs"
        self.inputs = inputs  # the folder clients may name input files in (None: none)
        self.say = say or notices.quiet
        self._lock = threading.Condition()
        self._jobs: dict[str, Job] = {}
        self._queue: collections.deque[str] = collections.deque()
        self._closing = False
        self._running: str | None = None
        self._thread: threading.Thread | None = None
        self._load()

    # ------------------------------------------------------------------ disk

    def _load(self) -> None:
        """Jobs an earlier server left: finished ones are served, the rest queued again
        in submission order."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for staged in self.directory.glob(f"{STAGING}*"):  # a submit cut short
            shutil.rmtree(staged, ignore_errors=True)
        found = []
        for path in self.directory.glob(f"*/{JOB}"):
            try:
                data = json.loads(path.read_text())
                found.append(Job(data["id"], data["seq"], data["settings"], **{
                    k: v for k, v in data.items() if k not in ("id", "seq", "settings")}))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self.say(f"ignoring {path}: {exc}")
        for job in sorted(found, key=lambda j: j.seq):
            self._jobs[job.id] = job
            if job.status not in FINISHED and job.cancelling:  # the server stopped first
                job.status, job.finished = "cancelled", time.time()
                job.error, job.cancelling = f"cancelled at step {job.step}", False
                self._save(job)
            elif job.status not in FINISHED:
                job.status = "queued"
                self._queue.append(job.id)
                self._save(job)
        if self._queue:
            self.say(f"{len(self._queue)} unfinished job(s) queued again")

    def _save(self, job: Job) -> None:
        folder = self.directory / job.id
        folder.mkdir(exist_ok=True)
        record.write_json(folder / JOB, job.to_dict())

    def folder(self, job_id: str) -> Path:
        return self.directory / self.get(job_id).id

    # ------------------------------------------------------------------ requests

    def submit(self, settings: dict) -> Job:
        """Queue a job; its settings are checked first (``RecipeError``, as ``porter
        validate`` reports them). Its input files (``porter.commands.serve.uploads``) are
        copied into the job's folder: a job reads nothing outside it, and runs the same
        after a restart."""
        if not isinstance(settings, dict):
            raise UsageError("a job is a JSON object of generate settings",
                             hint='e.g. {"prompt": "a red fox", "seed": 3}')
        images = uploads.take(settings, self.inputs)
        staging = Path(tempfile.mkdtemp(prefix=STAGING, dir=self.directory))
        try:
            names = {key: f"{INPUTS}/{key}{suffix}" for key, (_, suffix) in images.items()}
            for key, (data, _) in images.items():
                atomic.write_bytes(staging / Path(names[key]).name, data)
            recipe = self.port.settings("request", **{**settings, **{
                k: str(staging / Path(n).name) for k, n in names.items()}})
            if self._idle():  # it would start now; behind other jobs, when it starts
                _room_for(recipe, self.port.registry, tuple(settings))
            return self._queued({**settings, **names}, staging)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _queued(self, settings: dict, staging: Path) -> Job:
        """A new job for checked ``settings``, its input files moved from ``staging``."""
        with self._lock:
            if self._closing:
                raise Closing("the server is shutting down" + (
                    f": {self.broken}" if self.broken else ""),
                    hint="submit it again after the server restarts")
            if self._waiting() >= self.max_queue:
                raise QueueFull(f"the queue is full ({self.max_queue} "
                                f"job{'s' if self.max_queue > 1 else ''} waiting)",
                                self._retry_after(),
                                hint="try again when a job has finished")
            # past every folder too: one whose job.json could not be read keeps its id
            seq = max([j.seq for j in self._jobs.values()] + [
                int(p.name) for p in self.directory.iterdir() if p.name.isdigit()],
                default=0) + 1
            job = Job(f"{seq:06d}", seq, settings)
            (self.directory / job.id).mkdir()
            if any(staging.iterdir()):
                os.replace(staging, self.directory / job.id / INPUTS)
            self._jobs[job.id] = job
            self._save(job)
            self._queue.append(job.id)
            self._lock.notify_all()
        return job

    def get(self, job_id: str) -> Job:
        with self._lock:
            if job_id not in self._jobs:
                raise KeyError(job_id)
            return self._jobs[job_id]

    def _retry_after(self) -> int:
        """Seconds until a full queue may take a job: the last finished job's run time
        (whole seconds, at least 1); 30 before any has finished."""
        ran = [job for job in self._jobs.values()
               if job.status == "done" and job.started and job.finished]
        if not ran:
            return 30
        last = max(ran, key=lambda job: job.finished)
        return max(1, math.ceil(last.finished - last.started))

    def list(self) -> list[Job]:
        with self._lock:
            return list(self._jobs.values())

    def cancel(self, job_id: str) -> Job:
        """Cancel a job: a queued one at once, a running one before its next stage or
        step (it reads ``running`` until then, with ``cancelling`` set, on disk too); a
        finished one cannot be (Conflict)."""
        with self._lock:
            job = self.get(job_id)
            if job.status == "running":
                job.cancelling = True
                self._save(job)  # a server stopped before the job is never runs it again
                interrupt.request_stop()  # before its next stage, or at its step's end
                return job
            if job.status != "queued":
                raise Conflict(f"job {job_id} is {job.status}: only a queued or running "
                               "job can be cancelled")
            self._queue.remove(job_id)
            job.status, job.finished = "cancelled", time.time()
            job.error = "cancelled before it started"  # as a running one says its step
            self._save(job)
            return job

    def delete(self, job_id: str) -> None:
        """Forget a job and its files (a queued one leaves the queue first); a running
        one cannot be (Conflict). Its folder stays, empty, so that its id is never
        given to another job."""
        with self._lock:
            job = self.get(job_id)
            if job.status == "running":
                raise Conflict(f"job {job_id} is running: it can be deleted once it has "
                               "finished")
            if job_id in self._queue:
                self._queue.remove(job_id)
            del self._jobs[job_id]
            folder = self.directory / job_id
            (folder / JOB).unlink(missing_ok=True)  # first: a restart forgets it
        for path in list(folder.iterdir()) if folder.is_dir() else []:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    def _idle(self) -> bool:
        """No job running or waiting: a job submitted now starts at once. (Otherwise
        what the running one holds is not free now, and will be when this one starts.)"""
        with self._lock:
            return self._running is None and not self._queue

    def _waiting(self) -> int:
        """Jobs in line behind the running one (that one is first in the queue)."""
        return len(self._queue) - (self._running is not None)

    def state(self) -> dict:
        with self._lock:
            return {"ready": self.ready_s is not None, "ready_s": self.ready_s,
                    "warmup": {"done": len(self.warmed), "total": len(self.warmups),
                               "runs": list(self.warmed)},
                    "queued": self._waiting(), "running": self._running,
                    "closing": self._closing, "max_queue": self.max_queue,
                    "error": self.broken}

    # ------------------------------------------------------------------ worker

    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, name="porter-jobs", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Take no more jobs; the running one stops before its next stage or at its
        step's end, with what it made saved (it stays queued for the next server);
        wait for it."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        interrupt.request_stop()
        waited = 0.0
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=1.0)
            # a port missing a process may wait for it for ever in a job's collectives
            waited = waited + 1.0 if self.broken else 0.0
            if waited >= LOST_JOIN_S:
                break
        interrupt.clear_stop()

    def lost(self, reason: str) -> None:
        """A process of the port is gone (``hosts.Followers`` tells, from its thread):
        the running job fails with ``reason``, nothing more is taken, queued jobs stay
        for the next start, and the server ends (``on_broken``)."""
        with self._lock:
            self.broken, self._closing = reason, True
            if self._running is not None:  # its worker may never come back to say so
                job = self._jobs[self._running]
                job.status, job.error, job.finished = "failed", reason, time.time()
                job.cancelling = False
                self._save(job)
            self._lock.notify_all()
        if self.on_broken is not None:
            self.on_broken()

    def _work(self) -> None:
        try:
            self._serve_queue()
        finally:
            if self.followers is not None:
                self.followers.close()  # the other processes stop with this one

    def _serve_queue(self) -> None:
        if not self._warm():
            return
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    self._lock.wait()
                if self._closing:
                    return
                job = self._jobs[self._queue[0]]
                self._running = job.id
                if job.started is not None:  # it ran before a stop: it continues
                    job.resumed += 1
                job.status, job.started, job.error = "running", time.time(), None
                self._save(job)
            stop, outcome = True, ("queued", None)
            try:
                stop, outcome = self._run(job)
            finally:
                with self._lock:  # readers see a job's final fields together
                    self._running = None
                    job.status, job.error = outcome
                    if job.cancelling:  # its stop is spent, or came too late (decoding):
                        interrupt.clear_stop()  # cleared before the next job starts
                        job.cancelling = False
                    if job.status in FINISHED:  # a stopped job stays first in line
                        self._queue.popleft()
                        job.finished = time.time()
                    else:  # (``lost`` may have ended it meanwhile)
                        job.finished = None
                    self._save(job)
            self.say(f"job {job.id} {job.status}")
            if stop or self.broken:
                return

    def _warm(self) -> bool:
        """Run each warm-up, nothing kept but its figures; then the server is ready.
        False when the server is stopping. A warm-up that fails is reported and
        skipped: jobs of its shape compile when they come."""
        if not self.warmups:
            return True
        for index, recipe in enumerate(self.warmups):
            gen = recipe.generate
            shape = f"{gen.width}x{gen.height}, {gen.frames} frames, {gen.steps} steps"
            start = time.perf_counter()
            if self._gone():  # a process is gone: nothing more runs
                return False
            sequence = self._hand_on("warmup", index=index)
            try:
                outcome = self.port.run(Call(recipe, say=self.say,  # previews as jobs do:
                                             preview_every=recipe.serve.preview_every))
            except Interrupted:
                self._settled(sequence, ("stopped", None))
                return False
            except Exception as exc:  # the server serves on: that shape compiles later
                error = failure(exc).one_line()
                if self._settled(sequence, ("failed", error)):
                    return False
                with self._lock:
                    self.warmed.append({"shape": shape, "error": error})
                self.say(f"warm-up {shape} failed: {error}")
                continue
            if self._settled(sequence, ("done", None)):
                return False
            seconds = round(time.perf_counter() - start, 2)
            compiled = outcome.timings["compile"]
            with self._lock:
                self.warmed.append({"shape": shape, "seconds": seconds,
                                    "compile_s": compiled["seconds"],
                                    "programs": compiled["programs"]})
            self.say(f"warmed up {shape}: {seconds:.1f} s ({compiled['programs']} "
                     f"programs compiled in {compiled['seconds']:.1f} s)")
        with self._lock:
            self.ready_s = monitor.process_seconds() or 0.0
        self.say(f"ready, {self.ready_s:.1f} s after the process started")
        return True

    def _run(self, job: Job) -> tuple[bool, tuple[str, str | None]]:
        """Run one job: (whether the server is stopping, (status, error)); a stopped
        job stays queued."""

        def on_step(done, total):
            job.step, job.steps = done, total
        try:
            recipe = self.port.settings("request", **self._settings(job))
            # again: memory freed or taken since it was submitted
            _room_for(recipe, self.port.registry, tuple(job.settings))
            job.steps = recipe.generate.steps
            call = Call(recipe, directory=self.directory / job.id, on_step=on_step,
                        say=self.say, preview_every=recipe.serve.preview_every)
        except Exception as exc:  # refused before it started: no other process ran it
            return False, ("failed", failure(exc).one_line())
        if self._gone():  # a process is gone: nothing more runs
            return True, ("queued", None)
        sequence = self._hand_on("job", id=job.id, settings=self._settings(job),
                                 folder=str(self.folder(job.id).resolve()))
        stop, outcome = self._ran(job, call)
        lost = self._settled(sequence, outcome)
        if lost:
            self.say(f"job {job.id}: {outcome[1] or outcome[0]}")  # what it ended with here
            # stopped at a step with its checkpoint (a process was sent a signal): it
            # continues at the next start; otherwise it failed for want of the process
            return True, (outcome if outcome[0] == "queued" else ("failed", lost))
        return stop, outcome

    def _ran(self, job: Job, call: Call) -> tuple[bool, tuple[str, str | None]]:
        """``_run``'s generation, with what it ended with."""
        try:
            runners.run_into(self.port, call, resume=True, name=f"job {job.id}",
                             what=f"porter serve (job {job.id})")
            return False, ("done", None)
        except Interrupted as exc:
            with self._lock:
                closing = self._closing
            if job.cancelling:  # cancelled: the server goes on, unless it is closing too
                return closing, ("cancelled", f"cancelled at step {job.step}")
            self.say(f"job {job.id} stopped" + (f"; kept: {exc.saved}" if exc.saved else ""))
            return True, ("queued", None)
        except Exception as exc:  # one job failed: the server goes on
            return False, ("failed", failure(exc).one_line())

    def _gone(self) -> bool:
        """Is a process of the port gone (told to ``lost``, or about to be)?"""
        return self.broken is not None or (
            self.followers is not None and self.followers.lost_reason is not None)

    def _hand_on(self, kind: str, **fields) -> int | None:
        """Hand a run to the other processes of the port (None: there are none)."""
        return self.followers.publish(kind, **fields) if self.followers else None

    def _settled(self, sequence: int | None, outcome: tuple[str, str | None]) -> str | None:
        """Once every process has ended run ``sequence``: None, or why one is gone (the
        server ends)."""
        if sequence is None:
            return None
        return self.followers.settle(sequence, outcome)

    def _settings(self, job: Job) -> dict:
        """A job's settings with its input files' names made paths in its folder
        (absolute: the other processes of a port read them too)."""
        folder = (self.directory / job.id).resolve()
        return {**job.settings, **{key: str(folder / job.settings[key]) for key in
                                   uploads.INPUT_KEYS if job.settings.get(key)}}

    def preview(self, job_id: str) -> Path | None:
        """The job's latest live preview (``porter.generate.preview``), while it runs and
        after; None before its first."""
        path = self.folder(job_id) / preview.FILE
        return path if path.exists() else None

    def stream(self, job_id: str) -> Path | None:
        """Where the job's frames are streamed as they are decoded (``stream.mp4``, a
        fragmented MP4 that grows while it runs); None for a job that has ended without
        one (it stopped before decoding, or its recipe streams none)."""
        path = self.folder(job_id) / outputs.STREAM
        output = self.port.recipe.output  # a job changes generate settings only
        streams = output.stream and output.video
        if (streams and self.get(job_id).status in ("queued", "running")) or path.exists():
            return path
        return None

    def ended(self, job_id: str) -> bool:
        """Is the job done, failed or cancelled, or deleted (nothing more will be
        written)?"""
        try:
            return self.get(job_id).status not in ("queued", "running")
        except KeyError:
            return True

    def video(self, job_id: str) -> Path | None:
        path = self.folder(job_id) / outputs.VIDEO
        return path if self.get(job_id).status == "done" and path.exists() else None

    def record_of(self, job_id: str) -> dict | None:
        path = self.folder(job_id) / outputs.RECORD
        if self.get(job_id).status != "done" or not path.exists():
            return None
        return json.loads(path.read_text())


def _room_for(recipe: Recipe, registry: Registry, asked: tuple[str, ...]) -> None:
    """NoRoom where a call of ``recipe`` needs more memory than the machine can give now
    (``checks.headroom_problems``: what other processes hold counted), so that a job
    is refused, or fails, instead of the kernel killing the server mid-job (``asked``:
    the settings the job gave)."""
    problems = checks.headroom_problems(recipe, registry, asked)
    if problems:
        raise NoRoom(problems[0].message, hint=problems[0].hint)
