"""A tiny random Cosmos 3 Omni pipeline (configs as in diffusers' own Cosmos 3 tests; the
hub's tiny-cosmos3-modular-pipe text tokenizer is replaced by a byte-level Qwen2Tokenizer
with a chat template and a <|vision_start|> token, built in code (models.easyanimate)). As in
the tests the pipeline is built with enable_safety_checker=False, a config flag: it is saved
and loaded with no safety checker at all."""

import torch


def build_cosmos3_omni_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=16, width=16,
    # num_frames=5, num_inference_steps=2, guidance_scale=1.0, use_system_prompt=False,
    # output_type="np") gives 5 finite 16x16 frames in .video (not .frames; no batch axis).
    from diffusers import (
        AutoencoderKLWan,
        Cosmos3OmniPipeline,
        Cosmos3OmniTransformer,
        UniPCMultistepScheduler,
    )

    from models.easyanimate import qwen2_byte_tokenizer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = Cosmos3OmniTransformer(
            head_dim=6, hidden_act="relu2", hidden_size=6, intermediate_size=12,
            latent_channel=16, latent_patch_size=1, num_attention_heads=1, num_hidden_layers=1,
            num_key_value_heads=1, patch_latent_dim=16, qk_norm_for_text=False,
            rms_norm_eps=1e-5, rope_axes_dim=[1, 1, 1], vocab_size=151657)
        torch.manual_seed(0)
        vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                               temperal_downsample=[False, True, True])
    for module in (transformer, vae):
        module.eval()
    return Cosmos3OmniPipeline(
        transformer=transformer,
        text_tokenizer=qwen2_byte_tokenizer(extra_special=("<|vision_start|>",)), vae=vae,
        scheduler=UniPCMultistepScheduler(), sound_tokenizer=None, safety_checker=None,
        enable_safety_checker=False)
