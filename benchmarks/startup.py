"""Time to the first video: `porter run` cold (no caches), warm (the compile cache and
the trace cache from the cold run), and for a second shape; `porter serve` from its
start to its first finished job, warm, without and with `serve.warmup` of the job's
shape. First, the commands that read a recipe only (`porter --help`, `new`, `plugins`,
`validate`, `plan`): each one's wall time in fresh processes, first with an empty cache,
then the median of ``--repeats`` more. Each in a fresh process; the split comes from each run's record (run.json):

- before the port: the interpreter, imports, the recipe's checks (``startup_s``)
- loading (``load_s``), moving the weights to the devices (``to_jax_s``)
- compiling, all of it, inside the stages below: tracing and lowering, the backend's
  compile, reading compiled programs from the cache (``timings.compile``)
- encode, the denoising steps (the first one pays the transformer's compile), decode

    python benchmarks/startup.py [--recipe recipes/wan-tiny.yaml] [--second width=96]
        [--repeats 3] [--commands-only] [KEY=VALUE ...]   (recipe overrides for every run)
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def porter_run(recipe, out, cache, *overrides) -> dict:
    """A `porter run` in a fresh process: its wall time and its record."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "porter.cli", "run", str(recipe),
                    f"output.dir={out}", "--no-progress", *overrides], cwd=ROOT, check=True,
                   env={**os.environ, "PORTER_CACHE_DIR": str(cache)}, capture_output=True)
    wall = time.perf_counter() - start
    return {"wall_s": wall, **json.loads((out / "run.json").read_text())["timings"]}


def porter_serve(recipe, out, cache, job: dict, *overrides) -> dict:
    """`porter serve` from its start to its first job's end: the time /health first
    answered, the time it said ready, the job's record."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.perf_counter()
    log = open(out.parent / f"{out.name}.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "porter.cli", "serve", str(recipe), f"output.dir={out}",
         "--port", str(port), *overrides], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "PORTER_CACHE_DIR": str(cache)})
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
    answered = ready = None
    try:
        while ready is None:
            assert server.poll() is None, open(log.name).read()
            try:
                health = client.get("/health").json()
            except httpx.TransportError:
                time.sleep(0.1)
                continue
            answered = answered or time.perf_counter() - start
            if health["ready"]:
                ready = time.perf_counter() - start
            else:
                time.sleep(0.1)
        job = client.post("/jobs", json=job).json()
        while (status := client.get(f"/jobs/{job['id']}").json())["status"] not in (
                "done", "failed"):
            time.sleep(0.05)
        wall = time.perf_counter() - start
        assert status["status"] == "done", status
        record = client.get(f"/jobs/{job['id']}/record").json()
    finally:
        server.terminate()
        server.wait(timeout=120)
        log.close()
    return {"wall_s": wall, "answered_s": answered, "ready_s": ready,
            "ready_process_s": health.get("ready_s"), **record["timings"]}


def light_commands(recipe, repeats: int) -> list[tuple[str, float, float, float]]:
    """(command, first, median, slowest) wall seconds of each command that reads a recipe
    only, run once in a fresh process with an empty cache of its own (``validate`` and
    ``plan`` then build the model and keep its sketches), then ``repeats`` times more
    (the median and the slowest of those: a model checked before). ``new`` writes
    into a scratch folder."""
    found = []
    with tempfile.TemporaryDirectory() as scratch:
        for args in (["--help"], ["new", "starter", "--family", "wan", "--force"],
                     ["plugins"], ["validate", str(recipe)], ["plan", str(recipe)]):
            env = {**os.environ, "PORTER_CACHE_DIR": tempfile.mkdtemp(dir=scratch)}
            times = []
            for _ in range(repeats + 1):
                start = time.perf_counter()
                subprocess.run([sys.executable, "-m", "porter.cli", *args], cwd=scratch,
                               check=True, capture_output=True, env=env)
                times.append(time.perf_counter() - start)
            found.append((" ".join(["porter", *args[:1]]), times[0],
                          statistics.median(times[1:]), max(times[1:])))
    return found


def row(name: str, t: dict) -> str:
    compiled = t.get("compile", {})
    steps = t.get("steps_s", [])
    cells = [t["wall_s"], t.get("startup_s"), t.get("load_s"), t.get("to_jax_s"),
             compiled.get("trace_s", 0) + compiled.get("lower_s", 0),
             compiled.get("backend_s"), compiled.get("cache_load_s"), t.get("encode_s"),
             steps[0] if steps else None, sum(steps[1:]) if steps else None,
             t.get("decode_s")]
    shown = ["" if c is None else f"{c:.1f}" for c in cells]
    return f"| {name} | " + " | ".join(shown) + " |"


HEADER = ("| run | wall | before the port | loading | to devices | tracing | compiling | "
          "cache reads | encode | first step | other steps | decode |\n"
          "| --- |" + " ---: |" * 11)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default=str(ROOT / "recipes" / "wan-tiny.yaml"))
    parser.add_argument("--second", default="width=96",
                        help="the second shape: a generate setting, KEY=VALUE")
    parser.add_argument("--repeats", type=int, default=3,
                        help="fresh processes per light command after its first (the "
                        "median is shown)")
    parser.add_argument("--commands-only", action="store_true",
                        help="time the light commands only, no run or server")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    print("| command | first, empty cache (s) | median (s) | slowest (s) |\n"
          "| --- | ---: | ---: | ---: |")
    for command, first, median, slowest in light_commands(Path(args.recipe).resolve(),
                                                          args.repeats):
        print(f"| {command} | {first:.2f} | {median:.2f} | {slowest:.2f} |")
    if args.commands_only:
        return
    key, value = args.second.split("=", 1)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        cache = work / "cache"
        rows.append(row("porter run, cold", porter_run(args.recipe, work / "cold", cache,
                                                       *args.overrides)))
        rows.append(row("porter run, warm caches", porter_run(
            args.recipe, work / "warm", cache, *args.overrides)))
        rows.append(row(f"porter run, warm caches, {key} {value}", porter_run(
            args.recipe, work / "second", cache, *args.overrides,
            f"generate.{key}={value}")))
        served = porter_serve(args.recipe, work / "serve", cache, {"seed": 1},
                              *args.overrides)
        rows.append(row("porter serve, warm caches, first job", served))
        warm = porter_serve(args.recipe, work / "serve-warm", cache, {"seed": 1},
                            *args.overrides, "serve.warmup=[{seed: 2}]")
        rows.append(row("porter serve + warmup, warm caches, first job", warm))
    print(HEADER)
    print("\n".join(rows))
    print(f"\nporter serve: /health answered after {served['answered_s']:.1f} s, ready at "
          f"{served['ready_s']:.1f} s; with the warm-up, ready at {warm['ready_s']:.1f} s "
          f"(the first job then done at {warm['wall_s']:.1f} s)")


if __name__ == "__main__":
    main()
