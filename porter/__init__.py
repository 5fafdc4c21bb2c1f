"""Porter: diffusers video models on JAX through torchax, driven by YAML recipes.

The library's face: ``porter.load(recipe)`` returns a ``Port`` whose ``generate``
makes videos (docs/python-api.md); ``porter.hookimpl`` marks a plugin's hooks
(docs/writing-plugins.md). Importing ``porter`` imports neither JAX nor torch: every
``porter.<package>`` below does what its name says, and only what a caller uses is
imported.
"""

from __future__ import annotations

from os import PathLike
from typing import TYPE_CHECKING

from porter.registry.hookspecs import hookimpl
from porter.shims import model_imports

# before anything imports diffusers' models: each imported when it is asked for, and
# with real tensors (porter/shims/model_imports.py)
model_imports.install()

if TYPE_CHECKING:
    from porter.api import Port
    from porter.recipe import Recipe

__version__ = "0.1.0"
__all__ = ["Generation", "Port", "hookimpl", "load"]


def load(recipe: str | PathLike | Recipe, *overrides: str, cpu_devices: int | None = None,
         progress: bool = False) -> Port:
    """Validate, load, port and prepare a recipe's pipeline: a ``porter.api.Port``
    whose ``generate(prompt=..., seed=..., ...)`` makes videos (docs/python-api.md)."""
    from porter.api import load as _load  # lazy: `import porter` stays free of JAX

    return _load(recipe, *overrides, cpu_devices=cpu_devices, progress=progress)


def __getattr__(name):  # porter.Port, porter.Generation without importing JAX up front
    if name in ("Port", "Generation"):
        from porter import api  # lazy: `import porter` stays free of JAX

        return getattr(api, name)
    raise AttributeError(f"module 'porter' has no attribute {name!r}")
