"""A tiny random Wan video-to-video pipeline (configs as in diffusers' own Wan
video-to-video test)."""

import torch

from models.wan_parts import evaluated, tiny_t5, wan_vae


def wan_transformer(**overrides):
    from diffusers import WanTransformer3DModel

    settings = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                    in_channels=16, out_channels=16, text_dim=32, freq_dim=256, ffn_dim=32,
                    num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                    rope_max_seq_len=32)
    return WanTransformer3DModel(**{**settings, **overrides})


def build_wan_v2v_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(video (9 frames), "a cat", height=16,
    # width=16, num_inference_steps=4, guidance_scale=6.0, max_sequence_length=16,
    # output_type="np") gives 9 finite 16x16 frames.
    from diffusers import UniPCMultistepScheduler, WanVideoToVideoPipeline

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        vae = wan_vae()
        torch.manual_seed(0)
        text_encoder, tokenizer = tiny_t5()
        torch.manual_seed(0)
        transformer = wan_transformer()
    evaluated(vae, text_encoder, transformer)
    return WanVideoToVideoPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae,
        scheduler=UniPCMultistepScheduler(flow_shift=3.0))
