"""A tiny random LTX2InContextPipeline: the components of the tiny LTX2Pipeline (diffusers'
own LTX-2 in-context tests use the same)."""


def build_ltx2_in_context_pipeline():
    # Checked in plain diffusers (CPU, float32): see the matrix entry's call (a condition
    # of one 32x32 image at frame 0, crf 0).
    from diffusers import LTX2InContextPipeline

    from models.ltx2 import ltx2_components

    return LTX2InContextPipeline(**ltx2_components())
