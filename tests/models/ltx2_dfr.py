"""A tiny random LTX2DFRPipeline (diffusers has no test of it): the components of the tiny
LTX2Pipeline with the keyframe position embedding LTX-2.5 transformers have (and the
pipeline requires), initialised away from zero."""


def build_ltx2_dfr_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=32, width=32,
    # num_frames=9, frame_rate=25.0, max_sequence_length=16, sigmas=[1.0, 0.5],
    # output_type="np") gives 9 finite 32x32 frames.
    from diffusers import LTX2DFRPipeline

    from models.ltx2 import ltx2_components

    return LTX2DFRPipeline(**ltx2_components(
        transformer_kwargs={"use_keyframes_abs_pos_embedding": True}, keyframe_embedding=True))
