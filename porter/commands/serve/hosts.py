"""``porter serve`` across processes (hosts): one port spans every process's devices;
process 0 takes the HTTP requests and runs each job, and every other process runs
the same job in step with it.

What passes between them goes through JAX's coordination service
(``porter.runtime.coordination``), not a messaging layer of Porter's. Keys, under
``serve/``:

- ``run/N``: process 0's N-th run: a warm-up, a job (its settings and folder), or the
  word to stop. The others take them in order.
- ``ended/N/P``: how run N ended on process P ("done", "stopped" or its error).
- ``verdict/N``: how it ended on process 0. A process whose run failed waits for it:
  failed there too, the job simply failed (a bad setting fails everywhere at the
  same point); otherwise it failed alone, in the middle of the job's collectives,
  and leaves, so that process 0 is not left waiting in them.
- ``beat/P``: process P's heartbeat, a counter it raises every ``BEAT_S`` seconds,
  from a thread of its own (it beats while it computes or compiles).
- ``gone/P``: why process P left (an error, a signal).
- ``folder``, ``sees/P``: the check that every process sees the jobs' folder.
- ``abort``: why process 0 stopped before serving (the others stop too).

Process 0 watches the heartbeats and departures. A process that leaves, or does not
beat for ``HEARTBEAT_S`` seconds (its host died), ends the server: the running job
fails with a message naming the process, queued jobs stay for the next start, and
the server exits with that message (``Jobs.lost``). A job's collectives need every
process: on CPU (gloo) they fail at once when one is gone; elsewhere they may wait,
and the server ends without them. Cancelling and stopping need nothing of their
own here: every stop a run checks is agreed by all its processes at the same point
(``porter.runtime.interrupt.agreed_request``). The processes run with JAX's
recoverability on (``distributed.initialize(recoverable=True)``): without it JAX
ends every process, mid-response, when one stops.

Every process reads a job's input files and (resuming) its checkpoints from process
0's ``output.dir``: it must be on a filesystem every host mounts at the same path,
which is checked before loading.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from porter.errors import Interrupted, UsageError, failure
from porter.generate import runners
from porter.generate.call import Call
from porter.runtime import coordination, distributed, interrupt

#: seconds between a process's heartbeats
BEAT_S = 1.0
#: seconds without a heartbeat after which process 0 counts a process as gone
#: (``PORTER_SERVE_HEARTBEAT_S`` changes it)
HEARTBEAT_S = 20.0
#: seconds a process whose run failed waits for the others' word on how it ended there
#: (another process for process 0's verdict, process 0 for the others' ends) before
#: counting them out of step
VERDICT_S = 30.0
#: seconds process 0 waits, as it stops, for the others to leave the runtime
LEAVE_S = 30.0
#: what a run that ended well, or stopped, reports (anything else is an error)
DONE, STOPPED = "done", "stopped"
#: the file process 0 leaves in the jobs' folder for the others to find
SEEN = ".processes"


def heartbeat_s() -> float:
    return float(os.environ.get("PORTER_SERVE_HEARTBEAT_S", HEARTBEAT_S))


def _key(*parts) -> str:
    return "serve/" + "/".join(str(part) for part in parts)


def _ended(outcome: tuple[str, str | None]) -> str:
    """A run's (status, error) as the text ``ended``/``verdict`` carry."""
    status, error = outcome
    return error or status


class Followers:
    """Process 0's side: hands each run to the other processes, hears how it ended on
    each, and watches that every one is still there (``on_lost`` is told once, from
    the watching thread, when one is not)."""

    def __init__(self):
        self.count = distributed.process_count()
        self.others = range(1, self.count)
        self.sequence = 0
        self.lost_reason: str | None = None
        #: what to do when a process is gone: before jobs run, end this process
        self.on_lost: Callable[[str], None] = _end_process
        self._stopped = threading.Event()
        self._once = threading.Lock()
        self._thread = threading.Thread(target=self._watch, name="porter-followers",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ before loading

    def share_folder(self, folder: Path) -> None:
        """Every process must see ``folder`` (the jobs' folder): a random mark is left
        there, and each process says whether it finds it. UsageError naming the
        processes that do not."""
        mark = secrets.token_hex(8)
        (folder / SEEN).write_text(mark)
        coordination.put(_key("folder"), json.dumps({"path": str(folder), "mark": mark}))
        blind = []
        for process in self.others:
            answer = self._answer(_key("sees", process))
            if answer != "yes":
                blind.append(f"process {process}: {answer}")
        if blind:
            raise UsageError(f"not every process sees {folder}: {'; '.join(blind)}",
                             hint="put output.dir on a filesystem every host mounts at "
                                  "the same path (jobs' input files and checkpoints are "
                                  "read by every process)")

    # ------------------------------------------------------------------ runs

    def publish(self, kind: str, **fields) -> int:
        """Hand the next run to every process; its number."""
        if self.lost_reason is not None:
            raise RuntimeError(f"no run can be handed on: {self.lost_reason}")
        self.sequence += 1
        coordination.put(_key("run", self.sequence), json.dumps({"kind": kind, **fields}))
        return self.sequence

    def settle(self, sequence: int, outcome: tuple[str, str | None]) -> str | None:
        """Say how run ``sequence`` ended here, and wait until every process has said
        how it ended there. None, or why a process is gone (the server must end).
        Where it failed here, the others get ``VERDICT_S`` seconds: a run that failed on
        this process alone leaves them waiting in its collectives, and the server ends."""
        coordination.put(_key("verdict", sequence), _ended(outcome))
        failed = outcome[0] == "failed"
        deadline = time.monotonic() + VERDICT_S if failed else None
        for process in self.others:
            answer = self._answer(_key("ended", sequence, process), deadline)
            if answer is None and self.lost_reason is None:  # out of time
                self._lost(f"process {process} of {self.count} had not ended run "
                           f"{sequence} {VERDICT_S:g} s after it failed on process 0 "
                           f"({outcome[1]}): the processes are out of step")
            if answer is None:
                return self.lost_reason
        return None

    def close(self) -> None:
        """Tell the other processes to stop, and wait (up to ``LEAVE_S``) until they
        have left the runtime: this process hosts its service, and gone first it would
        end them mid-exit."""
        self._stopped.set()
        if self.lost_reason is None:
            self.publish("stop")
            waiting = threading.Thread(target=coordination.departed, args=(self.count,),
                                       daemon=True)
            waiting.start()
            waiting.join(LEAVE_S)

    def abort(self, reason: str) -> None:
        """Process 0 stops before serving: stop watching, and tell the others why (they
        stop too, instead of waiting for runs)."""
        self._stopped.set()
        coordination.put(_key("abort"), reason)

    def _answer(self, key: str, deadline: float | None = None) -> str | None:
        """``key`` once some process sets it; None once a process is lost, or at
        ``deadline`` (``time.monotonic``)."""
        while True:
            found = coordination.wait(key, 1.0)
            if found is not None:
                return found
            if self.lost_reason is not None:
                return None
            if deadline is not None and time.monotonic() > deadline:
                return None

    # ------------------------------------------------------------------ watching

    def _watch(self) -> None:
        """Every ``BEAT_S``: a process that said it left, or whose heartbeat has not
        moved for ``heartbeat_s()``, is lost."""
        limit = heartbeat_s()
        seen = {process: (None, time.monotonic()) for process in self.others}
        while not self._stopped.wait(BEAT_S):
            for process in self.others:
                try:
                    reason = coordination.look(_key("gone", process))
                    beat = coordination.look(_key("beat", process))
                except Exception:  # noqa: BLE001 - the service, a moment: look again
                    continue
                if reason is not None:
                    return self._lost(f"process {process} of {self.count} left: {reason}")
                last, since = seen[process]
                if beat != last:
                    seen[process] = (beat, time.monotonic())
                elif time.monotonic() - since > limit:
                    return self._lost(f"process {process} of {self.count} stopped "
                                      f"answering (no heartbeat for {limit:g} s: its "
                                      "process or host died)")

    def _lost(self, reason: str) -> None:
        with self._once:
            if self.lost_reason is not None:
                return
            self.lost_reason = reason
        self.on_lost(reason)


def _end_process(reason: str) -> None:
    """A process lost while the port loads: nothing is running that could end cleanly
    (the load waits in collectives with the missing process)."""
    print(f"error: {reason}; the server stops", file=sys.stderr, flush=True)
    os._exit(1)


# ---------------------------------------------------------------------- the others


class _Heart:
    """A thread that raises this process's heartbeat every ``BEAT_S`` seconds."""

    def __init__(self, process: int):
        self.key = _key("beat", process)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="porter-heartbeat",
                                        daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while True:
            try:
                coordination.count(self.key)
            except Exception:  # noqa: BLE001 - the service, a moment: the next beat
                pass
            if self._stopped.wait(BEAT_S):
                return

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=10)


def follow(open_port: Callable, warmups: list, say=print) -> int:
    """A process other than 0: open the port with the others, then run each run
    process 0 hands on, until it says stop (0) or this process cannot go on (it says
    why under ``gone/P`` first). ``open_port()`` opens the port."""
    process = distributed.process_index()
    heart = _Heart(process)
    try:
        with interrupt.terminate_raises():
            _see_folder(process)
            port = open_port()
            say("ready; process 0 takes the requests")
            code = _runs(port, process, warmups, say)
    except Interrupted as exc:
        return _leave(process, heart, f"stopped by signal {exc.signum}", 128 + exc.signum)
    except KeyboardInterrupt:
        return _leave(process, heart, "stopped by Ctrl-C", 130)
    except Blind:  # said so under sees/P: process 0 stops with it
        _leave(process, heart)
        raise
    except Exception as exc:
        _leave(process, heart, failure(exc).one_line())
        raise
    _leave(process, heart)
    return code


def _leave(process: int, heart: _Heart, reason: str | None = None, code: int = 1) -> int:
    """Stop beating, say why this process leaves (``reason``; none when process 0
    said stop), and leave the runtime while process 0 still hosts it."""
    heart.stop()
    try:
        if reason is not None:
            coordination.put(_key("gone", process), reason)
        distributed.leave()
    except Exception:  # the service (process 0) is gone too: nobody to tell
        pass
    return code


class Blind(UsageError):
    """This process does not see the jobs' folder."""


def _awaited(key: str) -> str:
    """``key``'s value once process 0 sets it; UsageError if process 0 stops first."""
    while True:
        found = coordination.wait(key, 1.0)
        if found is not None:
            return found
        reason = coordination.look(_key("abort"))
        if reason is not None:
            raise UsageError(f"process 0 stopped: {reason}", hint="see process 0's message")


def _see_folder(process: int) -> None:
    """Find process 0's mark in the jobs' folder, and say whether it is there."""
    shared = json.loads(_awaited(_key("folder")))
    mark = Path(shared["path"]) / SEEN
    try:
        found = mark.read_text() == shared["mark"]
        answer = "yes" if found else f"{mark} holds another server's mark"
    except OSError as exc:
        answer = f"cannot read {mark} ({exc.strerror or exc})"
    coordination.put(_key("sees", process), answer)
    if answer != "yes":
        raise Blind(f"this process does not see {shared['path']}: {answer}",
                         hint="put output.dir on a filesystem every host mounts at the "
                              "same path")


def _runs(port, process: int, warmups: list, say) -> int:
    sequence = 0
    while True:
        sequence += 1
        run = json.loads(_awaited(_key("run", sequence)))
        if run["kind"] == "stop":
            say("process 0 stopped the server")
            return 0  # ``follow`` leaves the runtime
        outcome = _run(port, run, warmups, say)
        coordination.put(_key("ended", sequence, process), outcome)
        if outcome not in (DONE, STOPPED):
            verdict = coordination.wait(_key("verdict", sequence), VERDICT_S)
            if verdict is None:  # process 0 still waits for this one's collectives
                raise UsageError(f"run {sequence} failed on this process alone: {outcome}")


def _run(port, run: dict, warmups: list, say) -> str:
    """One run as process 0 runs it: what it ended with."""
    interrupt.forget_received()
    try:
        if run["kind"] == "warmup":
            recipe = warmups[run["index"]]
            port.run(Call(recipe, say=say, preview_every=recipe.serve.preview_every))
        else:
            recipe = port.settings("request", **run["settings"])
            call = Call(recipe, directory=Path(run["folder"]), say=say,
                        preview_every=recipe.serve.preview_every)
            runners.run_into(port, call, resume=True, name=f"job {run['id']}",
                             what=f"porter serve (job {run['id']})")
        return DONE
    except Interrupted:
        if interrupt.received():  # this process was sent a signal: it leaves
            raise
        return STOPPED  # process 0 stopped the run (a cancel): every process did
    except Exception as exc:
        error = failure(exc).one_line()
        say(f"run failed: {error}")
        return error
