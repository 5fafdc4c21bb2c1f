"""Weightless diffusers layouts of published checkpoints, shipped with Porter
(``porter/loading/layouts/<org>--<name>/``): each component's configuration, the
scheduler's settings and the index, as the hub repository has them, so that
``validate``, ``plan`` and ``compile`` read a real-size model from its hub id with no
download (the generic family's counterpart of a plugin's ``official_configs``).

Shipped: LTX-2.3 (``diffusers/LTX-2.3-Diffusers``), MiniMax-H3 (``MiniMaxAI/MiniMax-H3``)
and Wan-Animate-2 (``Wan-AI/Wan2.2-Animate-2-14B-Diffusers``), the last two modular
checkpoints (their ``modular_model_index.json`` points at the hub, as the hub's does;
diffusers reads the files found here instead). A layout's tokenizer stands in for the
real one: where the pipeline pads every prompt to a fixed length (LTX-2's Gemma to
1024 tokens, Wan's UMT5 to 512) the shapes it gives are the real tokenizer's;
MiniMax-H3's byte-level stand-in gives a token a byte, about four times the real
count. A class this machine cannot build stands in too (``porter.loading.standins``).
A run downloads the repository itself; a layout is never read then. Where each
configuration comes from: benchmarks/published-configs.md.
"""

from __future__ import annotations

from pathlib import Path

from porter.recipe.modular import INDEX

FOLDER = Path(__file__).resolve().parent / "layouts"


def layout(source: str) -> Path | None:
    """The shipped layout of hub id ``source``, or None."""
    folder = FOLDER / source.replace("/", "--")
    if (folder / "model_index.json").is_file() or (folder / INDEX).is_file():
        return folder
    return None


def shipped() -> list[str]:
    """The hub ids a layout ships for."""
    ids = (path.name.replace("--", "/", 1) for path in FOLDER.iterdir())
    return sorted(source for source in ids if layout(source) is not None)
