"""A recipe's step cache against the same recipe without it: the denoise stage's
wall time, the transformer blocks computed, and how far the latents moved.

Each side loads its own port (the uncached one compiled whole, as a run without
``cache:`` is). Compiling is counted on neither side: a family whose steps Porter
drives is timed over its steps after the first (which compiles); a pipeline's own
loop runs twice and the second, warm, call is timed.
"""

from __future__ import annotations

from porter import api
from porter.stepcache import without_cache


def _denoised(recipe):
    """(final latents, denoise seconds without compiling, cache summary or None)."""
    with api.load(recipe) as port:
        outcome = port.run(recipe, wanted=("encode", "denoise"))
        if "steps_s" not in outcome.timings:  # the pipeline's own loop: no step timings
            outcome = port.run(recipe)  # the first call compiled; time a warm one
    timings = outcome.timings
    seconds = sum(timings["steps_s"][1:]) if "steps_s" in timings else timings["generate_s"]
    return outcome.latents, seconds, timings.get("cache")


def compare(recipe) -> dict:
    """Denoise with and without the recipe's cache; what changed."""
    plain, plain_s, _ = _denoised(without_cache(recipe))
    cached, cached_s, summary = _denoised(recipe)
    difference = (cached.float() - plain.float())
    return {
        "method": summary["method"], "steps": recipe.generate.steps,
        "denoise_s": {"uncached": round(plain_s, 4), "cached": round(cached_s, 4),
                      "ratio": round(cached_s / plain_s, 3)},
        "speedup": round(plain_s / cached_s, 3),
        "blocks_computed": summary["blocks_computed"], "blocks_total": summary["blocks_total"],
        "skipped_steps": summary["skipped_steps"],
        "latents_max_abs_diff": float(difference.abs().max()),
        "latents_relative_l2": float(difference.norm() / plain.float().norm()),
    }


def render(result: dict) -> str:
    seconds = result["denoise_s"]
    return (f"  cache {result['method']}: denoise {seconds['cached']:.2f} s vs "
            f"{seconds['uncached']:.2f} s uncached ({result['speedup']:.2f}x), blocks "
            f"computed {result['blocks_computed']} of {result['blocks_total']}, latents "
            f"moved {result['latents_relative_l2']:.2e} (relative L2; max |diff| "
            f"{result['latents_max_abs_diff']:.2e}); skipped steps "
            f"{result['skipped_steps']}")
