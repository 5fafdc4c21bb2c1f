"""porter serve: the recipe's model served over HTTP, a JSON API of jobs."""

from __future__ import annotations

import os
import sys

from porter.cli import common
from porter.runtime import notices

HELP = "serve the recipe's model over HTTP (a JSON API of jobs)"


def add(commands) -> None:
    parser = commands.add_parser(
        "serve", help=HELP,
        description="Load and port the recipe's model once, then take jobs over HTTP: "
        "POST /jobs with any generate settings (JSON), GET /jobs/ID for status and step, "
        "GET /jobs/ID/video and /record for results, DELETE /jobs/ID to cancel a job; "
        "the API is described at /docs, OpenAI's video API answers at /v1/videos, and "
        "a page for people at / (open the address in a browser). Jobs run one at a time "
        "in submission order "
        "and live in output.dir/jobs. SIGTERM or Ctrl-C stops after the running job's "
        "next step with a checkpoint; started again on the same output.dir, the server "
        "serves what is done and continues the rest.")
    common.recipe_args(parser)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only; "
                             "anything else needs a token)")
    parser.add_argument("--port", type=common.tcp_port, default=8000,
                        help="TCP port (default 8000; 0: any free one, said when serving)")
    parser.add_argument("--token", help="bearer token every request must carry (default: "
                        "the PORTER_TOKEN environment variable)")
    parser.add_argument("--queue", type=common.positive, default=16, metavar="N",
                        help="jobs that may wait (default 16; more are refused with 429)")
    parser.add_argument("--inputs", metavar="DIR",
                        help="folder whose image files jobs may name (\"image\": "
                             "\"frame.png\"; links may not lead out of it). Without it, "
                             "jobs send images as data URLs; the server opens no other "
                             "path a request names")
    common.process_args(parser, "a port across processes (hosts)", "Start one `porter "
                        "serve` per process, each with the same recipe, settings and "
                        "coordinator: the port spans every process's devices, process 0 "
                        "listens and runs each job, the others run it in step with it, "
                        "and output.dir must be on a filesystem every host sees. A "
                        "process that is gone ends the server: its running job fails "
                        "with a message naming the process, queued jobs wait for the "
                        "next start.")


def handle(args) -> int:
    # lazy: only the subcommand asked for is imported
    from porter import registry as registry_mod
    from porter.commands import serve  # lazy: only the subcommand asked for is imported

    common.request_processes(args)
    loaded = common.load_recipe(args)
    listen = serve.Listen(args.host, args.port, args.token, args.queue, args.inputs)
    state = serve.serve(loaded, registry_mod.loaded(), listen, say=notices.status)
    if "exit" in state:  # a process other than 0: it ran what process 0 handed on
        return state["exit"]
    left = (f"; {state['queued']} job(s) left queued for the next start"
            if state["queued"] else "")
    if state["error"] is None:
        print("stopped" + left, file=sys.stderr)
        return 0
    print(f"error: the server stopped: {state['error']}{left}", file=sys.stderr, flush=True)
    # a process of the port is gone: this one's job, or JAX's own leaving at exit, may
    # wait in collectives for it; nothing is left to save
    sys.stdout.flush()
    os._exit(1)
