"""What the benchmark scripts share: saving results as they arrive, and matplotlib."""

from __future__ import annotations

import json
from pathlib import Path


def save(path: Path, results: list[dict]) -> None:
    """Write ``results`` as JSON, atomically: an interrupted benchmark keeps what it
    measured so far."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(results, indent=1) + "\n")
    partial.replace(path)


def pyplot():
    """matplotlib's pyplot, drawing to files (plots are optional: pip install matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("drawing needs matplotlib: pip install matplotlib") from None
    return plt
