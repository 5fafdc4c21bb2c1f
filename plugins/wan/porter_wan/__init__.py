"""Porter plugin for Wan video models (Wan 2.1 text-to-video)."""

from porter import hookimpl
from porter_wan.family import WanFamily
from porter_wan.patches import ROPE_CACHE, VAE_DECODE_SCAN, VAE_ENCODE_SCAN


@hookimpl
def porter_register_families(register):
    register(WanFamily())


@hookimpl
def porter_register_patches(register):
    register(ROPE_CACHE)
    register(VAE_DECODE_SCAN)
    register(VAE_ENCODE_SCAN)
