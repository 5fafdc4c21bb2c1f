"""Porter: diffusers video models on JAX through torchax, driven by YAML recipes."""

__version__ = "0.1.0"
