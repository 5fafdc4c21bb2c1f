"""``porter serve R``: the recipe's port behind an HTTP JSON API (FastAPI, uvicorn).

One model in memory; jobs (any generate settings) run one at a time in
submission order from a bounded queue (``jobs``); the HTTP side is ``app``'s. The API:

- ``POST /jobs``: submit (201; 400 with the messages ``porter validate`` gives;
  429 when the queue is full; 503 while shutting down, or when the machine cannot give
  the job the memory it needs now)
- ``GET /jobs``, ``GET /jobs/{id}``: status, with the denoising step under way
- ``GET /jobs/{id}/video``, ``GET /jobs/{id}/record``: the results of a done job
- ``DELETE /jobs/{id}``: cancel a job (a running one before its next stage or step)
- ``GET /``: a page for people (``page``), its form filled from ``GET /settings``
- ``GET /health``: ``ready`` once the recipe's ``serve.warmup`` jobs have run (each
  once, at start, so a request of their shape compiles nothing), and the queue; the
  OpenAPI description at ``/openapi.json``, pages at ``/docs``

With a token (``--token`` or ``PORTER_TOKEN``) every request needs
``Authorization: Bearer <token>``, the API description included (the page's three
files alone are open: a browser cannot send a token for a page it opens); the server
refuses to listen beyond this machine without one. A job's images come in the
request as data URLs, or as names of files in the folder ``--inputs DIR`` names;
the server opens no other path a client gives (``porter.commands.serve.uploads``).
A request body has at most ``MAX_BODY`` bytes and ``MAX_DEPTH`` levels of nesting
(``limits``); every refusal answers ``{"error": ...}``, OpenAI's shape under
``/v1/`` (``openai_api``). SIGTERM (or Ctrl-C) stops taking jobs, stops the running
job before its next stage or at its step's end, saving what it made, and exits; a
server started again on the same ``output.dir`` serves what is done and continues
the rest.

Across processes (``--coordinator``, or JAX's multi-process settings), the port spans
every process's devices: process 0 listens and runs each job, the others run it in
step with it (``hosts``), and a process that is gone ends the server with a message.
"""


from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from porter import api
from porter.commands.serve import hosts
from porter.commands.serve import jobs as jobs_mod
from porter.commands.serve.app import build_app
from porter.errors import Interrupted, RecipeError, UsageError, failure
from porter.port import checks
from porter.rundir import outputs
from porter.rundir.outputs import output_dir
from porter.runtime import distributed

if TYPE_CHECKING:
    from porter.recipe import Recipe
    from porter.registry import Registry

TOKEN_ENV = "PORTER_TOKEN"


#: seconds a closing server gives open responses (a job's stream) to end by themselves
STREAMS_CLOSE_S = 2
#: seconds a server that cannot go on (a process of its port is gone) still answers,
#: with the reason, before it stops
BROKEN_ANSWERS_S = 3

def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_for(host: str, given: str | None) -> str | None:
    """The bearer token (``--token``, else ``PORTER_TOKEN``); beyond loopback one is
    required."""
    token = given or os.environ.get(TOKEN_ENV) or None
    if token is None and not is_loopback(host):
        raise UsageError(f"--host {host} listens beyond this machine without a token",
                         hint=f"set --token or {TOKEN_ENV} (clients then send "
                              "'Authorization: Bearer <token>'), or listen on 127.0.0.1")
    return token


def inputs_folder(given: str | None):
    """``--inputs DIR`` as an existing folder (None: clients send images' bytes)."""
    if given is None:
        return None
    folder = Path(given).expanduser()
    if not folder.is_dir():
        raise UsageError(f"--inputs {given}: not a folder",
                         hint="name the folder whose image files clients may name")
    return folder.resolve()


def warmup_recipes(recipe: Recipe, registry: Registry) -> list:
    """``serve.warmup``'s entries as the recipes their jobs would run, checked as a
    job's settings are (problems located at the entry)."""
    found, problems = [], []
    for index, settings in enumerate(recipe.serve.warmup):
        where = recipe.problem(f"serve.warmup.{index}", "")
        try:
            found.append(checks.with_settings(recipe, registry, settings,
                                              str(where.file or "recipe"), where.line))
        except RecipeError as exc:
            problems += exc.problems
    if problems:
        raise RecipeError(problems)
    return found


@dataclass(frozen=True)
class Listen:
    """Where the server listens, for whom, and what it takes."""

    host: str = "127.0.0.1"
    port: int = 8000
    token: str | None = None  # None: PORTER_TOKEN's, if set (required beyond loopback)
    queue: int = 16  # jobs that may wait
    inputs: str | None = None  # the folder whose files jobs may name


def serve(recipe: Recipe, registry: Registry, listen: Listen = Listen(), say=print) -> dict:
    """Load the port, then serve until SIGTERM/Ctrl-C; returns the queue's state at
    the end (``error``: why the server ended by itself). A process other than 0 of a multi-process port runs
    the jobs process 0 hands it instead (``hosts.follow``), and returns
    ``{"exit": code}``."""
    token = token_for(listen.host, listen.token)
    inputs = inputs_folder(listen.inputs)
    family = checks.checked_family(recipe, registry)
    warmups = warmup_recipes(recipe, registry)  # before loading: a bad one fails at once
    directory = output_dir(recipe)
    # a process that dies must not take the others with it mid-response: the server
    # notices and ends itself (hosts.Followers)
    distributed.initialize(recoverable=True)
    if not distributed.writes():
        return {"exit": hosts.follow(lambda: api.Port.open(recipe, registry, family, say),
                                     warmups, say)}
    followers = hosts.Followers() if distributed.process_count() > 1 else None
    try:
        with outputs.owned(directory, "porter serve"), _bound(listen) as sockets:
            if followers is not None:
                (directory / "jobs").mkdir(parents=True, exist_ok=True)
                followers.share_folder((directory / "jobs").resolve())
            port_ = api.Port.open(recipe, registry, family, say)
            queue = jobs_mod.Jobs(port_, directory, listen.queue, say, inputs, warmups,
                                  followers)
            _listen(build_app(queue, token), queue, sockets, say)
            return queue.state()
    except Exception as exc:
        if followers is not None and followers.sequence == 0:  # before serving
            followers.abort(failure(exc).message)
        raise


@contextlib.contextmanager
def _bound(listen: Listen):
    """The server's sockets, listening before the model loads (minutes at real size):
    an address in use, or one this machine does not have, is said at once. One socket
    an address the host names (``localhost``: 127.0.0.1 and ::1), as uvicorn binds."""
    try:
        found = socket.getaddrinfo(listen.host, listen.port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise UsageError(f"cannot listen on {listen.host}: {exc.strerror or exc}",
                         hint="--host takes an address or name of this machine "
                              "(127.0.0.1, 0.0.0.0)") from None
    with contextlib.ExitStack() as held:
        sockets, port = [], listen.port
        for family, _, _, _, address in dict.fromkeys((f, *rest) for f, *rest in found):
            sock = held.enter_context(socket.socket(family, socket.SOCK_STREAM))
            sockets.append(_listening(sock, (address[0], port, *address[2:]), listen))
            port = port or sock.getsockname()[1]  # --port 0: every address the same one
        yield sockets


def _listening(sock: socket.socket, address: tuple, listen: Listen) -> socket.socket:
    """``sock`` bound to ``address`` and listening (connections made while the model
    loads wait in its backlog), or a UsageError that says why not."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
    if sock.family == socket.AF_INET6:  # "::" is IPv6's alone, as asyncio makes it
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    try:
        sock.bind(address)
        sock.listen(2048)  # uvicorn's backlog
    except OSError as exc:
        hints = {errno.EADDRINUSE: "another server has that port: give another --port "
                                   "(0: any free one)",
                 errno.EACCES: "ports below 1024 need privileges: give --port 1024 or "
                               "above"}
        raise UsageError(f"cannot listen on {listen.host}:{listen.port}: "
                         f"{exc.strerror or exc}",
                         hint=hints.get(exc.errno, "--host takes an address of this "
                                                   "machine")) from None
    return sock


def _listen(app, queue, sockets: list, say) -> None:
    """Answer HTTP on ``sockets`` (listening) until SIGTERM/Ctrl-C, or until the queue
    cannot go on (``Jobs.on_broken``)."""
    import uvicorn

    # a stream's response lasts as long as its job: on SIGTERM, uvicorn waits this
    # long for open responses, then closes them and lets the running job checkpoint
    # (the lifespan's shutdown), instead of waiting for the job
    server = uvicorn.Server(uvicorn.Config(
        app, log_level="warning", timeout_graceful_shutdown=STREAMS_CLOSE_S))
    # clients polling the running job, or the health, see why before the server goes
    queue.on_broken = lambda: threading.Timer(
        BROKEN_ANSWERS_S, setattr, (server, "should_exit", True)).start()
    if queue.broken:  # lost while the server was being built
        queue.on_broken()
    host, port = sockets[0].getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    say(f"serving {queue.port.recipe.path} on http://{shown}:{port} (a page "
        f"at /, the API described at /docs); jobs in {queue.directory}")
    try:
        server.run(sockets=sockets)
    except (Interrupted, KeyboardInterrupt):
        pass  # uvicorn passes the signal on once it has shut down: that was the plan
