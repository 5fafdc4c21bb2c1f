"""A run that runs out of memory, reported as what it needs and what to change.

Out of memory (XLA's RESOURCE_EXHAUSTED, "Out of memory allocating" from its CPU
client, a MemoryError on the host) is the machine refusing what the recipe asks:
not a Porter bug but a setting to change, so it exits 2 like bad input. The
message carries the estimate `porter validate` and `porter plan` make (weights
and the largest attention per device, against what a device has) and the hint
the settings that lower it.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from porter.errors import OutOfMemory, PorterError, is_out_of_memory
from porter.port import estimates
from porter.runtime import memory
from porter.transforms.attention import backends
from porter.transforms.sharding import human_bytes

if TYPE_CHECKING:
    from porter.recipe import Recipe
    from porter.registry import Registry


@contextlib.contextmanager
def explained(recipe: Recipe, registry: Registry):
    """Out-of-memory failures inside as ``OutOfMemory`` for ``recipe``."""
    try:
        yield
    except PorterError:
        raise
    except Exception as exc:  # noqa: BLE001 - classified below; the rest pass through
        if not is_out_of_memory(exc):
            raise
        raise refused(exc, recipe, registry) from exc


def refused(exc: BaseException, recipe: Recipe, registry: Registry) -> OutOfMemory:
    need = _estimate(recipe, registry)
    return OutOfMemory(f"out of memory running the model ({_reason(exc)})"
                       + (f"; estimated per device: {need}" if need else ""),
                       hint=_hint(recipe, registry))


def _reason(exc: BaseException) -> str:
    """The allocation that failed, without XLA's repeated wrapping ("INTERNAL: Error
    dispatching computation: ... Out of memory allocating N bytes")."""
    text = " ".join(str(exc).split())
    for marker in ("RESOURCE_EXHAUSTED", "Out of memory"):
        if marker in text:
            text = text[text.index(marker):]
            break
    return text[:300] or type(exc).__name__


def _estimate(recipe: Recipe, registry: Registry) -> str | None:
    """The weights and the largest attention per device, against what a device has
    (None when the model's configuration is not at hand, e.g. a hub id offline)."""
    try:
        built = estimates.build(recipe, registry)
        need = estimates.attention_need(recipe, registry, built["weights_bytes_per_device"],
                                        built["estimates"])
        limit = memory.device_memory(built["devices"])
    except Exception:  # noqa: BLE001 - the estimate is extra; the refusal stands alone
        return None
    human = human_bytes
    text = f"weights {human(built['weights_bytes_per_device'])}"
    if need is not None:
        kept = ", kept twice (scores and softmax)" if need["materialised"] else " (blocks)"
        text += (f" and {need['attention']}-attention scores {human(need['scores'])} per "
                 f"layer{kept}: about {human(need['bytes'])}")
    if limit is not None:
        text += f", of the {human(limit.bytes)} a device has (set by {limit.source})"
    return text


def _hint(recipe: Recipe, registry: Registry) -> str:
    changes = ["attention.backend: blockwise or auto (scores block by block)"] \
        if backends.materialises(recipe.attention.backend, registry.attention) else []
    changes += ["more devices or sharding rules (mesh, sharding) to split the weights "
                "and activations", "decoding tile by tile (setup: {vae: [enable_tiling]})",
                "a lower generate.height, width or frames"]
    return f"try {'; '.join(changes)}. `porter plan` shows the bytes per device"
