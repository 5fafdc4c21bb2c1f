"""A tiny random Helios pipeline (configs as in diffusers' own Helios test)."""

import torch

from models.wan_parts import evaluated, tiny_t5, wan_vae


def helios_parts():
    """vae, text encoder and tokenizer, transformer of the Helios test."""
    from diffusers import HeliosTransformer3DModel

    torch.manual_seed(0)
    vae = wan_vae()
    torch.manual_seed(0)
    text_encoder, tokenizer = tiny_t5()
    torch.manual_seed(0)
    transformer = HeliosTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16,
        out_channels=16, text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_dim=(4, 4, 4),
        has_multi_term_memory_patch=True, guidance_cross_attn=True,
        zero_history_timestep=True, is_amplify_history=False)
    evaluated(vae, text_encoder, transformer)
    return vae, text_encoder, tokenizer, transformer


def build_helios_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=16, width=16,
    # num_frames=9, num_inference_steps=2, guidance_scale=1.0, max_sequence_length=16,
    # output_type="np") gives 33 finite 16x16 frames (one chunk of 9 latent frames).
    from diffusers import HeliosPipeline, HeliosScheduler

    with torch.random.fork_rng(devices=[]):
        vae, text_encoder, tokenizer, transformer = helios_parts()
    return HeliosPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
        scheduler=HeliosScheduler(stage_range=[0, 1], stages=1, use_dynamic_shifting=True))
