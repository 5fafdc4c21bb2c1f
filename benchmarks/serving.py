"""Ten videos four ways: 10 `porter run` calls, one `porter run --prompts`, 10
`Port.generate` calls in one process, and 10 jobs on `porter serve`; total wall
time and the compile time each pays. Every way starts in a fresh process with a
cold compile cache of its own, so the numbers compare what a user pays.

    python benchmarks/serving.py [--recipe recipes/wan-tiny.yaml] [--count 10]
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["a red fox running through fresh snow", "a lighthouse at dusk, waves",
           "a paper boat drifting down a gutter", "an old tram crossing a bridge",
           "a hummingbird over a red flower", "rain on a window at night",
           "a kite above a green hill", "a cat asleep on a warm windowsill",
           "steam rising from a cup of tea", "a bicycle leaning on a yellow wall"]


def env(cache: Path) -> dict:
    return {**os.environ, "PORTER_CACHE_DIR": str(cache)}


def porter(*args, cache):
    return subprocess.run([sys.executable, "-m", "porter.cli", *map(str, args)], cwd=ROOT,
                          env=env(cache), capture_output=True, text=True, check=True)


def compile_of(record: Path) -> float:
    return json.loads(record.read_text())["timings"]["compile"]["seconds"]


def separate_runs(recipe, prompts, work):
    cache, compiled = work / "cache-runs", 0.0
    for i, prompt in enumerate(prompts):
        out = work / f"run-{i}"
        porter("run", recipe, f"generate.prompt={prompt}", f"output.dir={out}",
               "--no-progress", cache=cache)
        compiled += compile_of(out / "run.json")
    return compiled


def batch(recipe, prompts, work):
    file = work / "prompts.txt"
    file.write_text("\n".join(prompts) + "\n")
    out = work / "batch"
    porter("run", recipe, "--prompts", file, f"output.dir={out}", "--no-progress",
           cache=work / "cache-batch")
    return sum(compile_of(p) for p in out.glob("*/run.json"))


LIBRARY = """
import json, sys, porter
port = porter.load(sys.argv[1])
total = 0.0
for prompt in json.loads(sys.argv[2]):
    total += port.generate(prompt=prompt).record["timings"]["compile"]["seconds"]
print(total)
"""


def library(recipe, prompts, work):
    done = subprocess.run([sys.executable, "-c", LIBRARY, str(recipe), json.dumps(prompts)],
                          cwd=ROOT, env=env(work / "cache-lib"), capture_output=True,
                          text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def server(recipe, prompts, work):
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = work / "serve"
    process = subprocess.Popen([sys.executable, "-m", "porter.cli", "serve", str(recipe),
                                f"output.dir={out}", "--port", str(port), "--queue",
                                str(len(prompts))], cwd=ROOT, env=env(work / "cache-srv"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
    try:
        while True:
            try:
                client.get("/health")
                break
            except httpx.TransportError:
                time.sleep(0.1)
        ids = [client.post("/jobs", json={"prompt": p}).json()["id"] for p in prompts]
        while any(client.get(f"/jobs/{i}").json()["status"] != "done" for i in ids):
            time.sleep(0.1)
        return sum(client.get(f"/jobs/{i}/record").json()["timings"]["compile"]["seconds"]
                   for i in ids)
    finally:
        process.terminate()
        process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(ROOT / "recipes" / "wan-tiny.yaml"))
    parser.add_argument("--count", type=int, default=10)
    args = parser.parse_args()
    prompts = (PROMPTS * (args.count // len(PROMPTS) + 1))[:args.count]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, way in (("10 x porter run", separate_runs),
                           ("porter run --prompts", batch),
                           ("10 x Port.generate", library),
                           ("10 jobs on porter serve", server)):
            start = time.perf_counter()
            compiled = way(args.recipe, prompts, Path(tmp))
            rows.append((label, time.perf_counter() - start, compiled))
            print(f"{label:26s} {rows[-1][1]:7.1f} s total, {compiled:6.1f} s compiling",
                  flush=True)
    base = rows[0][1]
    print("\n| way | total (s) | compile (s) | vs 10 x porter run |\n| --- | --- | --- | --- |")
    for label, total, compiled in rows:
        print(f"| {label} | {total:.1f} | {compiled:.1f} | {base / total:.1f}x faster |")


if __name__ == "__main__":
    main()
