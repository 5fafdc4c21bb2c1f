"""A chunked model's stream on this machine, as a user runs it: a tiny test model saved
from its builder (tests/models), then ``porter run`` in fresh processes, cold and with
warm compile caches, and what each run record says of the stream."""

import json
import subprocess
import sys
import time
from pathlib import Path

from results_io import save

ROOT = Path(__file__).resolve().parent.parent


def saved(builder: str, folder: Path) -> Path:
    """``builder`` ("models.helios:build_helios_pipeline") saved to ``folder``."""
    module, function = builder.split(":")
    subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[2]); "
                    f"from {module} import {function}; "
                    f"{function}().save_pretrained(sys.argv[1])",
                    str(folder), str(ROOT / "tests")], check=True)
    return folder


def cold_and_warm(path: Path, work: Path, about: dict, *overrides: str) -> list[dict]:
    """Two runs of recipe ``path`` (the compile cache the recipe names: empty, then
    filled by the first), each a row of ``about`` and its stream's timings (where it
    wrote one)."""
    rows = []
    for attempt in ("cold", "warm"):
        out = work / attempt
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "porter.cli", "run", str(path), "--no-progress",
                        f"output.dir={out}", *overrides], check=True, capture_output=True)
        wall = time.perf_counter() - start
        record = json.loads((out / "run.json").read_text())
        timings, made = record["timings"], record["outputs"]["frames"]
        rows.append({**about, "frames": made, "caches": attempt,
                     "process_s": round(wall, 2), "startup_s": timings.get("startup_s"),
                     "generate_s": timings.get("generate_s")})
        stream = timings.get("stream")  # none where the run wrote no stream
        if stream:
            rows[-1].update({**stream, "frames_per_second": round(made / stream["done_s"], 1),
                             "seconds_a_later_chunk": round(
                                 (stream["done_s"] - stream["first_chunk_s"])
                                 / max(stream["chunks"] - 1, 1), 3)})
        print(json.dumps(rows[-1], indent=1), flush=True)
    return rows


#: the VAE's dtype a bound was compiled with, where the recipe's was overridden
#: (``--vae-dtype``): a row's variant beside its target
VAE_DTYPE = "vae_dtype"


def compiled_on(targets: list[str], out: Path, argv: list[str], row_of,
                vae_dtype: str | None = None) -> None:
    """``porter compile ARGV --target T --json`` for each target, each report made a row
    by ``row_of(target, report, video)`` (its video bound, {} where none) or an error
    row, saved to ``out`` as it comes; the rows already there for other targets, or for
    another VAE dtype, kept. ``vae_dtype``: the VAE's dtype instead of the recipe's
    (``dtypes.components.vae``), recorded in the row."""
    if vae_dtype is not None:
        argv = [*argv, f"dtypes.components.vae={vae_dtype}"]
    variant = {VAE_DTYPE: vae_dtype} if vae_dtype is not None else {}
    rows = [row for row in (json.loads(out.read_text()) if out.exists() else [])
            if row["target"] not in targets or row.get(VAE_DTYPE) != vae_dtype]
    for target in targets:
        done = subprocess.run([sys.executable, "-m", "porter.cli", "compile", *argv,
                               "--target", target, "--json"], capture_output=True, text=True)
        if not done.stdout.strip().startswith("{"):
            rows.append({"target": target, **variant, "error": done.stderr.strip()[-2000:]})
        else:
            report = json.loads(done.stdout)
            rows.append({**row_of(target, report, report["video"] or {}), **variant})
            print(json.dumps(rows[-1], indent=1), flush=True)
        save(out, rows)
