"""A tiny random AnyFlow-FAR (frame-autoregressive) text-to-video pipeline (configs as in
diffusers' own AnyFlow-FAR test)."""

import torch

from models.anyflow import anyflow_parts


def build_anyflow_far_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=16, width=16,
    # num_frames=9, num_inference_steps=2, guidance_scale=6.0, max_sequence_length=16,
    # chunk_partition=[1, 1, 1], output_type="np") gives 9 finite 16x16 frames.
    from diffusers import AnyFlowFARPipeline, AnyFlowFARTransformer3DModel

    with torch.random.fork_rng(devices=[]):
        parts = anyflow_parts(AnyFlowFARTransformer3DModel, compressed_patch_size=(1, 4, 4),
                              full_chunk_limit=3)
    return AnyFlowFARPipeline(**parts)
