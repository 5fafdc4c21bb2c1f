"""A tiny random LTXI2VLongMultiPromptPipeline: the components of the tiny LTXPipeline (configs as in
diffusers' own LTX tests, which are the same for every LTX-Video pipeline)."""


def build_ltx_i2v_long_multi_prompt_pipeline():
    # Checked in plain diffusers (CPU, float32) with the matrix entry's call: finite frames.
    from diffusers import LTXI2VLongMultiPromptPipeline

    from models.ltx import build_ltx_pipeline

    return LTXI2VLongMultiPromptPipeline(**build_ltx_pipeline().components)
