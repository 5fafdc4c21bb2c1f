"""A command's work in a child process, so that a crash in native code becomes a
message: ``porter compile`` runs the TPU's compiler (libtpu) in its own process, and
when libtpu dies (a segmentation fault, a failed check) the process ends on the spot,
leaving the user a page of C++ frames and no word of what Porter was doing. Run as a
child, its status lines pass through as they come; a crash report it prints is kept
in a file instead; and if the child dies by a signal the parent says which, during
which of Porter's steps (its last status line), and where the report is.

Only the ``porter`` command itself takes this path (``main`` with no argument list):
the library and tests calling ``cli.main([...])`` run in their own process as before.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

#: set in the child's environment: the command runs there in-process
CHILD = "PORTER_CHILD"
#: where a native crash report starts: a fatal signal (Abseil's handler, as libtpu
#: prints it, its frames' link first where another thread's handler wins), a failed
#: check, a fatal log line, Python's own fault handler
CRASH_START = re.compile(rb"^(\*\*\* (SIG[A-Z]+|Check failure)|https://symbolize\."
                         rb"|F\d{4} \d\d:\d\d:\d\d|Fatal Python error)")
#: the signals native code dies of (its own faults and aborts)
CRASHES = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL,
                     signal.SIGFPE})
#: Porter's status lines (``notices.status``): what it was doing; its warnings
#: (``notices.warn``) begin the same, a process's label between
STATUS = b"porter: "
WARNING = re.compile(r"^(\[process \d+/\d+\] )?warning:")


def wanted(args) -> bool:
    """Does this invocation run its work in a child: the ``porter`` command itself
    (``args.entry``), not already in the child?"""
    return getattr(args, "entry", False) and CHILD not in os.environ


def again() -> list[str]:
    """This ``porter`` command line, to run in the child (``-P``: the current folder
    is not put first on its path, as the ``porter`` script does not put it)."""
    return [sys.executable, "-P", "-m", "porter.cli", *sys.argv[1:]]


def run(command: list[str], *, what: str, debug: bool = False) -> int:
    """``command`` (``again()``) in a child process, its exit code returned (a child
    killed by a signal: ``_killed``). stdout passes through untouched; stderr line by
    line, a crash report held for a file (shown as it comes with ``debug``). The child
    never outlives this process: stopped if this one leaves early, sent SIGTERM by the
    system if this one is killed."""
    stream = _Stderr(shown=debug)
    forwarded: list[int] = []
    started: list[subprocess.Popen] = []
    previous = _forward_signals(started, forwarded)  # before the child: no gap
    try:
        child = subprocess.Popen(command, stderr=subprocess.PIPE, preexec_fn=_dies_with_parent,
                                 env={**os.environ, CHILD: "1"})
        started.append(child)
        for line in iter(child.stderr.readline, b""):
            stream.feed(line)
        code = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if started and started[0].poll() is None:  # leaving early: the child too
            started[0].terminate()
            started[0].wait()
    if code >= 0 or -code not in CRASHES:
        stream.flush_held()  # what looked like a report's start, but nothing crashed
    return code if code >= 0 else _killed(-code, stream, forwarded, what, debug)


def _killed(signum: int, stream: _Stderr, forwarded: list[int], what: str,
            debug: bool) -> int:
    """The child died by ``signum``: said, as what it was (a stop, a kill, a native
    crash with its report kept), and the exit code."""
    name = _signal_name(signum)
    if signum in forwarded or signum == signal.SIGINT:  # stopped before Porter could say
        print(f"interrupted by {name}", file=sys.stderr)
        return 128 + signum
    doing = f" while {stream.doing}" if stream.doing else ""
    if signum not in CRASHES:
        hint = ("\n  hint: SIGKILL is what the out-of-memory killer sends: compile fewer "
                "programs at once (--program NAME)") if signum == signal.SIGKILL else ""
        print(f"error: {what} was killed by {name}{doing}{hint}", file=sys.stderr)
        return 1
    report = stream.kept()
    print(f"error: {what} died of {name} in native code (libtpu, the TPU compiler, or "
          f"a library beneath it){doing}", file=sys.stderr)
    print("  hint: " + "; ".join(filter(None, [
        f"the crash report is in {report}" if report else None,
        "compile the other programs alone with --program NAME",
        "LIBTPU_INIT_ARGS reaches libtpu as you set it (now: "
        f"{os.environ.get('LIBTPU_INIT_ARGS', 'unset')})",
        None if debug else "--debug shows the report as it comes"])), file=sys.stderr)
    return 1


class _Stderr:
    """The child's stderr, passed on a line at a time until a crash report starts;
    from there held (``kept`` writes it to a file), unless ``shown``."""

    def __init__(self, shown: bool):
        self.shown = shown
        self.held: list[bytes] = []
        self.doing = ""  # the last status line, without its "porter: "

    def feed(self, line: bytes) -> None:
        if line.startswith(STATUS) and not self.held:
            said = line[len(STATUS):].decode(errors="replace").strip()
            if not WARNING.match(said):  # a warning is not what it was doing
                self.doing = said
        if not self.shown and (self.held or CRASH_START.match(line)):
            self.held.append(line)
            return
        sys.stderr.buffer.write(line)
        sys.stderr.buffer.flush()

    def flush_held(self) -> None:
        sys.stderr.buffer.write(b"".join(self.held))
        sys.stderr.buffer.flush()

    def kept(self) -> str | None:
        """The held report written to a file of its own (its path), or None."""
        if not self.held:
            return None
        stamp = time.strftime("%Y%m%d-%H%M%S")
        handle, path = tempfile.mkstemp(prefix=f"porter-crash-{stamp}-", suffix=".log")
        with os.fdopen(handle, "wb") as out:
            out.write(b"".join(self.held))
        return path


def _forward_signals(started: list, forwarded: list[int]) -> dict:
    """SIGTERM (``kill``, a scheduler's stop) passed on to the child (the first of
    ``started``, once there; noted in ``forwarded``), which stops as any Porter command
    does; so is SIGINT, unless the terminal sent it (Ctrl-C reaches the child from the
    terminal itself, and a second would cut its cleanup short). The handlers replaced,
    to be put back. (Handlers, not SIG_IGN: an ignored signal stays ignored in a child.)"""
    if threading.current_thread() is not threading.main_thread():
        return {}  # only the main thread sets handlers

    def forward(signum, frame):
        if signum == signal.SIGINT and _from_terminal():
            return
        forwarded.append(signum)
        if started:
            started[0].send_signal(signum)

    return {signal.SIGTERM: signal.signal(signal.SIGTERM, forward),
            signal.SIGINT: signal.signal(signal.SIGINT, forward)}


def _from_terminal() -> bool:
    """Is this process in its terminal's foreground group (where Ctrl-C goes to every
    process of the group)? False without a terminal."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def _dies_with_parent() -> None:
    """In the child, before it runs: SIGTERM from the system when its parent dies
    (Linux's ``prctl(PR_SET_PDEATHSIG)``), so a killed ``porter`` leaves no compile
    behind it; elsewhere nothing."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
