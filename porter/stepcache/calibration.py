"""MagCache calibration files: what `porter calibrate` writes and `cache.mag_ratios`
reads.

One JSON object: ``ratios`` maps each transformer (``transformer``,
``transformer_2`` for two-expert models) to its ratios per cache context
(``cond``, ``uncond``, or ``inference`` for an unguided run), one per call of
that transformer in that context, in step order. A run uses the ``cond`` curve
(diffusers' MagCache keeps one curve for every context), resampled by diffusers
(nearest neighbour) to the steps that transformer gets in the run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from porter.runtime import atomic

if TYPE_CHECKING:
    from porter.recipe import Recipe

KIND = "porter-magcache-ratios"


def read(path: Path) -> dict:
    """The file's contents; ``ValueError`` saying what is wrong with it."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot be read as JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise ValueError(f"not a MagCache ratio file (no \"kind\": \"{KIND}\")")
    ratios = data.get("ratios")
    if not isinstance(ratios, dict) or not ratios:
        raise ValueError("no \"ratios\" per transformer")
    for name, contexts in ratios.items():
        if not isinstance(contexts, dict) or not contexts or not all(
                isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v)
                for v in contexts.values()):
            raise ValueError(f"ratios of {name!r}: expected lists of numbers per context")
    return data


def curve(contexts: dict) -> list[float]:
    """The curve a run uses: the conditional one where there is one."""
    return contexts.get("cond") or next(iter(contexts.values()))


def write(path: Path, ratios: dict, recipe: Recipe, steps: int) -> Path:

    data = {"kind": KIND, "recipe": str(recipe.path) if recipe.path else None,
            "model": {"family": recipe.model.family, "source": recipe.model.source,
                      "variant": recipe.model.variant, "dtype": recipe.model.dtype},
            "steps": steps, "ratios": ratios}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_bytes(path, (json.dumps(data, indent=1) + "\n").encode())
    return path
