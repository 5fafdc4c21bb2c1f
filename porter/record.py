"""The JSON record written beside every video: what ran, where, how long."""

from __future__ import annotations

import json
import os
import platform
from importlib import metadata
from pathlib import Path

PACKAGES = ("porter", "torch", "torchax", "jax", "jaxlib", "diffusers", "transformers")


def versions() -> dict[str, str | None]:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def weights(placed: dict, timings: dict) -> dict:
    """Where each component's weights came from, their bytes, and per device what
    the plan says against what the devices hold; the rate they were placed at."""
    total = sum(c["bytes"] for c in placed.values())
    seconds = timings.get("to_jax_s")
    return {"bytes": total, "placed_bytes_per_s": round(total / seconds) if seconds else None,
            "components": placed}


def build(recipe, runtime, timings: dict, outputs: dict, applied=(),
          placed: dict | None = None) -> dict:
    from porter import compat, distributed
    from porter.runtime import peak_memory
    return {
        "recipe": recipe.resolved(),
        "recipe_file": str(recipe.path) if recipe.path else None,
        "recipe_sha256": recipe.digest(),
        "seed": recipe.generate.seed,
        "versions": versions(),
        "torchax_compat_overloads": len(compat.replaced_overloads),
        "device": {"platform": runtime.platform, "kind": runtime.device_kind,
                   "count": int(runtime.mesh.devices.size),
                   "processes": distributed.process_count()},
        "mesh": runtime.axes,
        "patches": [{"name": p.name, "params": params, "fits": p.fits} for p, params in applied],
        "compile_cache": str(runtime.cache) if runtime.cache else None,
        "timings": timings,
        "weights": weights(placed or {}, timings),
        "memory": peak_memory(runtime),
        "outputs": outputs,
    }


def write_json(path: Path, data: dict) -> Path:
    """Write JSON atomically: a reader never sees a half-written file."""
    partial = Path(str(path) + ".partial")
    partial.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(partial, path)
    return Path(path)
