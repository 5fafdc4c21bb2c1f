"""Porter plugin for HunyuanVideo."""

from porter.hookspecs import hookimpl

from porter_hunyuan.family import HunyuanFamily
from porter_hunyuan.patches import ROPE_CACHE


@hookimpl
def porter_register_families(register):
    register(HunyuanFamily())


@hookimpl
def porter_register_patches(register):
    register(ROPE_CACHE)
