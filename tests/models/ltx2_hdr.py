"""A tiny random LTX2HDRPipeline: the components of the tiny LTX2Pipeline (diffusers' own
LTX-2 HDR tests use the same)."""


def build_ltx2_hdr_pipeline():
    # Checked in plain diffusers (CPU, float32): see the matrix entry's call (one 32x32
    # reference image).
    from diffusers import LTX2HDRPipeline

    from models.ltx2 import ltx2_components

    return LTX2HDRPipeline(**ltx2_components())
