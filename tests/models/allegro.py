"""A tiny random Allegro pipeline (configs as in diffusers' own Allegro tests; ByT5 tokenizer
in place of the hub's tiny-random-t5 one)."""

import torch


def build_allegro_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=320, width=320,
    # num_frames=24, num_inference_steps=2, guidance_scale=6.0, max_sequence_length=16,
    # clean_caption=False, output_type="np") gives 24 finite, non-constant 320x320 frames
    # (about 9 s). The Allegro VAE decodes only tiled, in tiles of 24 frames x 320 x 320 pixels:
    # with the diffusers test's own call (height=16, width=16, num_frames=8) no tile fits and
    # every frame is a constant 0.5, so compare latents there. Tiling is not saved: call
    # pipe.vae.enable_tiling() again after from_pretrained.
    from diffusers import (
        AllegroPipeline,
        AllegroTransformer3DModel,
        AutoencoderKLAllegro,
        DDIMScheduler,
    )
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = AllegroTransformer3DModel(
            num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
            num_layers=1, cross_attention_dim=24, sample_width=8, sample_height=8,
            sample_frames=8, caption_channels=24)
        torch.manual_seed(0)
        vae = AutoencoderKLAllegro(
            in_channels=3, out_channels=3, down_block_types=("AllegroDownBlock3D",) * 4,
            up_block_types=("AllegroUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8),
            latent_channels=4, layers_per_block=1, norm_num_groups=2,
            temporal_compression_ratio=4)
        vae.enable_tiling()
        text_encoder = T5EncoderModel(T5Config(
            d_ff=37, d_kv=8, d_model=24, num_decoder_layers=2, num_heads=4, num_layers=2,
            relative_attention_num_buckets=8, vocab_size=1103))
    for module in (transformer, vae, text_encoder):
        module.eval()
    return AllegroPipeline(tokenizer=ByT5Tokenizer(), text_encoder=text_encoder, vae=vae,
                           transformer=transformer, scheduler=DDIMScheduler())
