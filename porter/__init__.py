"""Porter: diffusers video models on JAX through torchax, driven by YAML recipes."""

__version__ = "0.1.0"


def load(recipe, *overrides, cpu_devices=None, progress=False):
    """Validate, load, port and prepare a recipe's pipeline: a ``porter.api.Port``
    whose ``generate(prompt=..., seed=..., ...)`` makes videos (docs/python-api.md)."""
    from porter.api import load as _load

    return _load(recipe, *overrides, cpu_devices=cpu_devices, progress=progress)


def __getattr__(name):  # porter.Port, porter.Generation without importing JAX up front
    if name in ("Port", "Generation"):
        from porter import api

        return getattr(api, name)
    raise AttributeError(f"module 'porter' has no attribute {name!r}")
