"""Porter plugin for HunyuanVideo and HunyuanVideo 1.5."""

from porter import hookimpl
from porter_hunyuan.family import HunyuanFamily
from porter_hunyuan.patches import (
    KEY_MASK_15,
    ROPE_CACHE,
    ROPE_CACHE_15,
    TRACEABLE_FORWARD_15,
    VAE_FRAME_CAUSAL,
    VAE_FRAME_CAUSAL_15,
)


@hookimpl
def porter_register_families(register):
    register(HunyuanFamily())


@hookimpl
def porter_register_patches(register):
    register(ROPE_CACHE)
    register(ROPE_CACHE_15)
    register(VAE_FRAME_CAUSAL)
    register(VAE_FRAME_CAUSAL_15)
    register(TRACEABLE_FORWARD_15)
    register(KEY_MASK_15)
