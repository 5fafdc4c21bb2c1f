"""docs/pipelines.md, written from the matrix: ``python tests/matrix/page.py`` (a test
fails while the page differs from what this writes)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from matrix.check import installed, matrix  # noqa: E402
from matrix.entries import Family, Matches, NotVideo, Refused, Untested  # noqa: E402

PAGE = HERE.parent.parent / "docs" / "pipelines.md"
#: settings every video recipe has: not worth a column entry
BASIC = {"prompt", "negative_prompt", "height", "width", "frames", "steps", "guidance_scale",
         "max_sequence_length", "seed"}


def keys(entry: Matches) -> str:
    found = [f"generate.{key}" for key in entry.generate if key not in BASIC | {"extra"}]
    found += [f"generate.extra.{key}" for key in entry.generate.get("extra", {})]
    found += [f"setup.{component}" for component in entry.setup]
    if entry.generate.get("prompt", "") is None:
        found.insert(0, "no generate.prompt")
    if "frames" not in entry.generate:
        found.insert(0, "no generate.frames")
    return ", ".join(f"`{key}`" if not key.startswith("no ") else key for key in found) \
        or "the basics"


def row(name: str, entry) -> str:
    if isinstance(entry, Matches):
        return f"| `{name}` | matches | {keys(entry)} | {entry.note} |"
    if isinstance(entry, Family):
        return (f"| `{name}` | matches, as `family: {entry.family}` | the family's recipes "
                f"| staged: resume, guidance cache; compared in `{entry.tests}` |")
    if isinstance(entry, Refused):
        return f"| `{name}` | refused by `porter validate` | | {entry.reason}{entry.note} |"
    if isinstance(entry, Untested):
        return f"| `{name}` | **not run yet** | | {entry.note} |"
    return f"| `{name}` | not a video pipeline | | {entry.note} |"


def render() -> str:
    known = matrix()
    names = sorted(set(installed()) | set(known))
    counted = [n for n in names if not isinstance(known.get(n), NotVideo)]
    runs = [n for n in counted if isinstance(known.get(n), (Matches, Family))]
    refused = [n for n in counted if isinstance(known.get(n), Refused)]
    untested = [n for n in counted if isinstance(known.get(n), Untested)]
    import diffusers

    lines = [
        "# Every diffusers video pipeline",
        "",
        "<!-- written by `python tests/matrix/page.py` from tests/matrix/; do not edit -->",
        "",
        f"Each video pipeline class of diffusers {diffusers.__version__}, built tiny from "
        "the component configurations of diffusers' own tests, saved as diffusers saves "
        "it, and run by Porter from a recipe of `model: {family: generic, source: DIR}` "
        "and `generate` keys (the column says which beyond prompt, size, frames, steps, "
        "guidance and text length); its frames are compared with plain diffusers from the "
        "same seed (`tests/e2e/test_pipeline_matrix.py`: every test run compares a cheap "
        "few of each group, `pytest -m matrix` the rest). A class `porter validate` refuses "
        "is refused with the reason below, before any weight is read.",
        "",
        "A modular pipeline (`...ModularPipeline`: blocks assembled at run time) runs from "
        "a recipe that names it in `model.pipeline` over a classic checkpoint of the same "
        "model, or from a modular checkpoint (`modular_model_index.json`), and is compared "
        "with diffusers' own modular run (the class from the checkpoint, "
        "`load_components`, the guidance scale on its guider). Where a pipeline makes "
        "sound, its waveform is compared too (the run's lossless `audio.wav`, within "
        "1e-3 of diffusers' samples).",
        "",
        f"{len(runs)} of {len(counted)} classes run and match ({len(runs) / len(counted):.0%}); "
        f"{len(refused)} are refused, {len(untested)} not run yet.",
        "",
        "| pipeline | status | recipe keys | notes |",
        "| --- | --- | --- | --- |",
    ]
    lines += [row(name, known[name]) if name in known
              else f"| `{name}` | not classified | | |" for name in names]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    PAGE.write_text(render())
    print(f"wrote {PAGE}")
