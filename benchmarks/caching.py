"""Step caching on the CPU bench transformer: denoise time, blocks computed, and how far
each method moves the latents from the uncached run.

    python benchmarks/caching.py                  # measure (about 17 minutes on 2 cores)
    python benchmarks/caching.py --plot-only      # redraw from the saved results
    python benchmarks/caching.py --only guidance  # measure again the runs named so
                                                  # (and their baselines), keep the rest

The Wan-shaped 2-block bench recipe (recipes/bench/wan-block-2k.yaml: width
1536, 2080 video tokens, text length 512) denoises 30 steps: first without a
cache, then with each method. Its text width is set to the tiny text encoder's
(32) so that the whole pipeline runs; the blocks are unchanged. Each denoise
run's first step (which compiles) is left out of its time. Random weights:
the thresholds here say nothing about image quality (docs/caching.md cites the
published figures). Results go to benchmarks/results/caching.json as they
arrive; the plot to benchmarks/caching.png (needs matplotlib).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import results_io  # benchmarks/, beside this script

HERE = Path(__file__).resolve().parent
RECIPE = HERE.parent / "recipes" / "bench" / "wan-block-2k.yaml"
RESULTS = HERE / "results" / "caching.json"
PLOT = HERE / "caching.png"
STEPS = 30
BASE = ("model.config.text_dim=32", f"generate.steps={STEPS}")
GUIDED = ("generate.guidance_scale=5.0",)


def runs(ratios: Path) -> list[tuple[str, tuple[str, ...], str]]:
    """(name, overrides, the uncached run it is compared with)."""
    return [
        ("uncached", (), "uncached"),
        ("magcache calibrating (nothing skipped)",
         ("cache={method: magcache, calibrate: true}",), "uncached"),
        ("magcache (defaults)", (f"cache={{method: magcache, mag_ratios: {ratios}}}",),
         "uncached"),
        ("magcache threshold 0.24, max_skip_steps 6",
         (f"cache={{method: magcache, mag_ratios: {ratios}, threshold: 0.24, "
          "max_skip_steps: 6}",), "uncached"),
        ("first_block (defaults)", ("cache={method: first_block}",), "uncached"),
        ("first_block threshold 0.2", ("cache={method: first_block, threshold: 0.2}",),
         "uncached"),
        ("first_block threshold 0.5", ("cache={method: first_block, threshold: 0.5}",),
         "uncached"),
        ("taylorseer (defaults)", ("cache={method: taylorseer}",), "uncached"),
        ("uncached, guided", GUIDED, "uncached, guided"),
        ("guidance (defaults), guided", GUIDED + ("cache={method: guidance}",),
         "uncached, guided"),
    ]


def denoise(overrides: tuple[str, ...]) -> tuple[dict, object]:
    import porter
    from porter.generate.call import Call

    with porter.load(RECIPE, *BASE, *overrides) as port:
        outcome = port.run(Call(port.recipe, ("encode", "denoise")))
    steps = outcome.timings["steps_s"]
    return {"denoise_s": round(sum(steps[1:]), 3), "steps_timed": len(steps) - 1,
            "cache": outcome.timings.get("cache")}, outcome.latents


def measure(only: str | None = None) -> list[dict]:
    """Every run, or those whose name contains ``only`` (with what they need: their
    baselines, and the calibration for MagCache), kept beside the saved others."""
    results, latents = [], {}
    with tempfile.TemporaryDirectory() as scratch:
        ratios = Path(scratch) / "ratios.json"
        chosen = runs(ratios)
        if only:
            wanted = [r for r in chosen if only in r[0]]
            needed = {r[2] for r in wanted} | {r[0] for r in wanted}
            if any(r[0].startswith("magcache") for r in wanted):
                needed.add("magcache calibrating (nothing skipped)")
            chosen = [r for r in chosen if r[0] in needed]
        for name, overrides, baseline in chosen:
            found, latents[name] = denoise(overrides)
            if name.startswith("magcache calibrating"):
                from porter import recipe as recipe_mod
                from porter.stepcache import calibration
                calibration.write(ratios, found["cache"]["ratios"],
                                  recipe_mod.load(RECIPE, BASE), STEPS)
                found["ratios"] = found["cache"].pop("ratios")
            base = next(r for r in results if r["name"] == baseline) \
                if baseline != name else None
            difference = (latents[name] - latents[baseline]).float()
            cache = found["cache"] or {}
            found.update(
                name=name, overrides=list(overrides),
                speedup=round(base["denoise_s"] / found["denoise_s"], 3) if base else 1.0,
                blocks_computed=cache.get("blocks_computed"),
                blocks_total=cache.get("blocks_total"),
                latents_relative_l2=float(difference.norm()
                                          / latents[baseline].float().norm()),
                latents_max_abs_diff=float(difference.abs().max()))
            results.append(found)
            save(_merged(results) if only else results)
            print(f"{name}: {found['denoise_s']:.1f} s, {found['speedup']:.2f}x, blocks "
                  f"{found['blocks_computed']}/{found['blocks_total']}, latents moved "
                  f"{found['latents_relative_l2']:.3g}", flush=True)
    return _merged(results) if only else results


def _merged(fresh: list[dict]) -> list[dict]:
    """The saved results with ``fresh`` ones in place of those of the same name."""
    kept = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    names = {r["name"] for r in fresh}
    order = [name for name, _, _ in runs(Path("ratios.json"))]
    merged = [r for r in kept if r["name"] not in names] + fresh
    return sorted(merged, key=lambda r: order.index(r["name"]) if r["name"] in order else 99)


def save(results: list[dict]) -> None:
    results_io.save(RESULTS, results)


def plot(results: list[dict]) -> None:
    plt = results_io.pyplot()
    shown = [r for r in results if not r["name"].startswith("uncached")]
    names = [r["name"].replace(" (", "\n(").replace(", guided", "\nguided") for r in shown]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    left.barh(names, [r["speedup"] for r in shown], color="tab:blue")
    left.axvline(1.0, color="grey", lw=1)
    left.set_xlim(0, max(r["speedup"] for r in shown) * 1.5)  # room for the labels
    left.set_xlabel("denoise speedup vs uncached (30 steps)")
    for i, r in enumerate(shown):
        left.annotate(f"{r['speedup']:.2f}x  ({r['blocks_computed']}/{r['blocks_total']} "
                      "blocks)", (r["speedup"], i), xytext=(4, -3),
                      textcoords="offset points", fontsize=8)
    right.barh(names, [max(r["latents_relative_l2"], 1e-8) for r in shown],
               color="tab:orange")
    right.set_xscale("log")
    right.set_xlabel("latents' relative L2 distance from uncached\n(random weights: "
                     "not a quality measure)")
    left.invert_yaxis()
    fig.suptitle("Step caching, Wan-shaped transformer (2 blocks, 2080 tokens), "
                 "float32, 2-core CPU")
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    print(f"wrote {PLOT}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plot-only", action="store_true")
    parser.add_argument("--only", metavar="TEXT",
                        help="measure again the runs whose name contains TEXT")
    args = parser.parse_args()
    results = json.loads(RESULTS.read_text()) if args.plot_only else measure(args.only)
    plot(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
