"""A tiny random AnyFlow text-to-video pipeline (configs as in diffusers' own AnyFlow
test)."""

import torch

from models.wan_parts import evaluated, tiny_t5, wan_vae

#: the transformer settings the AnyFlow and AnyFlow-FAR tests share
TRANSFORMER = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                   in_channels=16, out_channels=16, text_dim=32, freq_dim=256, ffn_dim=32,
                   num_layers=2, cross_attn_norm=True, rope_max_seq_len=32, gate_value=0.25,
                   deltatime_type="r")


def anyflow_parts(transformer_class, **overrides):
    """vae, text encoder and tokenizer, transformer and scheduler of the AnyFlow tests."""
    from diffusers import FlowMapEulerDiscreteScheduler

    torch.manual_seed(0)
    vae = wan_vae()
    torch.manual_seed(0)
    text_encoder, tokenizer = tiny_t5()
    torch.manual_seed(0)
    transformer = transformer_class(**{**TRANSFORMER, **overrides})
    evaluated(vae, text_encoder, transformer)
    scheduler = FlowMapEulerDiscreteScheduler(num_train_timesteps=1000, shift=5.0)
    return dict(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                transformer=transformer, scheduler=scheduler)


def build_anyflow_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=16, width=16,
    # num_frames=9, num_inference_steps=2, guidance_scale=6.0, max_sequence_length=16,
    # output_type="np") gives 9 finite 16x16 frames.
    from diffusers import AnyFlowPipeline, AnyFlowTransformer3DModel

    with torch.random.fork_rng(devices=[]):
        parts = anyflow_parts(AnyFlowTransformer3DModel)
    return AnyFlowPipeline(**parts)
