"""A tiny random CogVideoX pipeline with diffusers' plain DDIMScheduler (configs as in
diffusers' own CogVideoX tests; the hub's tiny-random-t5 text encoder is rebuilt from its
config in code, with a ByT5 tokenizer)."""

import torch


def build_cogvideox_ddim_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=16, width=16, num_frames=8,
    # num_inference_steps=2, guidance_scale=6.0, max_sequence_length=16, output_type="np")
    # gives 8 finite 16x16 frames (the transformer's max_text_seq_length is 16).
    from diffusers import (
        AutoencoderKLCogVideoX,
        CogVideoXPipeline,
        CogVideoXTransformer3DModel,
        DDIMScheduler,
    )
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = CogVideoXTransformer3DModel(
            num_attention_heads=4, attention_head_dim=8, in_channels=4, out_channels=4,
            time_embed_dim=2, text_embed_dim=32, num_layers=1, sample_width=2, sample_height=2,
            sample_frames=9, patch_size=2, temporal_compression_ratio=4, max_text_seq_length=16)
        torch.manual_seed(0)
        vae = AutoencoderKLCogVideoX(
            in_channels=3, out_channels=3, down_block_types=("CogVideoXDownBlock3D",) * 4,
            up_block_types=("CogVideoXUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8),
            latent_channels=4, layers_per_block=1, norm_num_groups=2,
            temporal_compression_ratio=4)
        text_encoder = T5EncoderModel(T5Config(  # hf-internal-testing/tiny-random-t5
            vocab_size=1103, d_model=32, d_kv=8, d_ff=37, num_layers=5, num_heads=4,
            relative_attention_num_buckets=8, initializer_factor=0.002))
    for module in (transformer, vae, text_encoder):
        module.eval()
    return CogVideoXPipeline(tokenizer=ByT5Tokenizer(), text_encoder=text_encoder, vae=vae,
                             transformer=transformer, scheduler=DDIMScheduler())
