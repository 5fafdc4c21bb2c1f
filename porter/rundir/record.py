"""The JSON record written beside every video: what ran, where, how long."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from porter.runtime import atomic, distributed
from porter.runtime.memory import peak_memory
from porter.runtime.versions import RECORDED, cpu_model, source_revision, versions
from porter.shims import compat

if TYPE_CHECKING:
    from porter.recipe import Recipe
    from porter.runtime import Runtime


def environment(runtime: Runtime) -> dict:
    """What else decides the compiled programs: XLA's flags and Porter's options."""
    return {"XLA_FLAGS": os.environ.get("XLA_FLAGS"),
            "LIBTPU_INIT_ARGS": os.environ.get("LIBTPU_INIT_ARGS"),
            "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS"),
            "xla_options": runtime.xla_options}


def segment(runtime: Runtime, stage: str, **extra) -> dict:
    """Where one stage (or part of denoising) ran: a run resumed elsewhere lists each."""
    return {"stage": stage, "mesh": runtime.axes, "platform": runtime.platform,
            "devices": int(runtime.mesh.devices.size),
            "processes": distributed.process_count(), **extra}


def weights(placed: dict, timings: dict) -> dict:
    """Where each component's weights came from, their bytes, and per device what
    the plan says against what the devices hold; the rate they were placed at."""
    total = sum(c["bytes"] for c in placed.values())
    seconds = timings.get("to_jax_s")
    return {"bytes": total, "placed_bytes_per_s": round(total / seconds) if seconds else None,
            "components": placed}


def build(recipe: Recipe, runtime: Runtime, ported, outcome, outputs: dict) -> dict:
    """The record of one generation: the recipe and where it ran; what the port loaded,
    patched and placed (``ported``, ``porter.transforms.building.Ported``); what the call took
    and told (``outcome``: timings, history, warnings); what it wrote (``outputs``)."""
    return {
        "recipe": recipe.resolved(),
        "recipe_file": str(recipe.path) if recipe.path else None,
        "recipe_sha256": recipe.digest(),
        "seed": recipe.generate.seed,
        "versions": versions(RECORDED),
        "porter_source": source_revision(),
        "environment": environment(runtime),
        "checkpoint": ported.checkpoint,
        "history": outcome.history or [],
        "torchax_compat_overloads": len(compat.replaced_overloads),
        "device": {"platform": runtime.platform, "kind": runtime.device_kind,
                   "count": int(runtime.mesh.devices.size),
                   "processes": distributed.process_count(), "host_cpu": cpu_model()},
        "mesh": runtime.axes,
        "patches": [{"name": p.name, "params": params, "fits": p.fits}
                    for p, params in ported.patches],
        "compile_cache": str(runtime.cache) if runtime.cache else None,
        "timings": outcome.timings,
        "schedule": outcome.schedule,
        "weights": weights(ported.weights or {}, outcome.timings),
        "memory": peak_memory(runtime.platform),
        "outputs": outputs,
        "warnings": outcome.warnings,
    }


def write_json(path: Path, data: dict) -> Path:
    """Write JSON atomically: a reader never sees a half-written file."""

    atomic.write_bytes(Path(path), (json.dumps(data, indent=2, sort_keys=False) + "\n")
                        .encode())
    return Path(path)
