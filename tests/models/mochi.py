"""A tiny random Mochi pipeline (configs as in diffusers' own Mochi tests; the hub's
tiny-random-t5 text encoder is rebuilt from its config in code, with a ByT5 tokenizer)."""

import torch


def build_mochi_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=16, width=16, num_frames=7,
    # num_inference_steps=2, guidance_scale=4.5, max_sequence_length=16, output_type="np")
    # gives 7 finite 16x16 frames (the transformer's max_sequence_length is 16).
    from diffusers import (
        AutoencoderKLMochi,
        FlowMatchEulerDiscreteScheduler,
        MochiPipeline,
        MochiTransformer3DModel,
    )
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = MochiTransformer3DModel(
            patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=2,
            pooled_projection_dim=16, in_channels=12, out_channels=None, qk_norm="rms_norm",
            text_embed_dim=32, time_embed_dim=4, activation_fn="swiglu", max_sequence_length=16)
        transformer.pos_frequencies.data = transformer.pos_frequencies.new_full(
            transformer.pos_frequencies.shape, 0)
        torch.manual_seed(0)
        vae = AutoencoderKLMochi(
            latent_channels=12, out_channels=3, encoder_block_out_channels=(32, 32, 32, 32),
            decoder_block_out_channels=(32, 32, 32, 32), layers_per_block=(1, 1, 1, 1, 1))
        text_encoder = T5EncoderModel(T5Config(  # hf-internal-testing/tiny-random-t5
            vocab_size=1103, d_model=32, d_kv=8, d_ff=37, num_layers=5, num_heads=4,
            relative_attention_num_buckets=8, initializer_factor=0.002))
    for module in (transformer, vae, text_encoder):
        module.eval()
    return MochiPipeline(tokenizer=ByT5Tokenizer(), text_encoder=text_encoder, vae=vae,
                         transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler())
