"""A tiny random LTXConditionPipeline: the components of the tiny LTXPipeline (configs as in
diffusers' own LTX tests, which are the same for every LTX-Video pipeline)."""


def build_ltx_condition_pipeline():
    # Checked in plain diffusers (CPU, float32) with the matrix entry's call: finite frames.
    from diffusers import LTXConditionPipeline

    from models.ltx import build_ltx_pipeline

    return LTXConditionPipeline(**build_ltx_pipeline().components)
