"""A tiny random LTX2ConditionPipeline: the components of the tiny LTX2Pipeline (diffusers'
own LTX-2 condition tests use the same)."""


def build_ltx2_condition_pipeline():
    # Checked in plain diffusers (CPU, float32): see the matrix entry's call (a condition
    # of one 32x32 image at frame 0, crf 0).
    from diffusers import LTX2ConditionPipeline

    from models.ltx2 import ltx2_components

    return LTX2ConditionPipeline(**ltx2_components())
