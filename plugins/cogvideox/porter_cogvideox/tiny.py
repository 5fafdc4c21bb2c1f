"""A tiny random CogVideoX pipeline (shapes as in diffusers' own CogVideoX tests),
with rotary position embeddings on, as in CogVideoX-5b (head width 16: the
rotary split needs even parts); ``version="1.5"`` adds
the temporal patch of CogVideoX 1.5."""

from __future__ import annotations

import torch


def build_pipeline(version: str = "1.0", seed: int = 0, image_to_video: bool = False):
    from diffusers import (
        AutoencoderKLCogVideoX,
        CogVideoXDDIMScheduler,
        CogVideoXImageToVideoPipeline,
        CogVideoXPipeline,
        CogVideoXTransformer3DModel,
    )
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    config = dict(num_attention_heads=2, attention_head_dim=16, in_channels=4,
                  out_channels=4, time_embed_dim=2, text_embed_dim=32, num_layers=1,
                  sample_width=2, sample_height=2, sample_frames=9, patch_size=2,
                  temporal_compression_ratio=4, max_text_seq_length=16,
                  use_rotary_positional_embeddings=True)
    if version == "1.5":
        config.update(patch_size_t=2, patch_bias=False)
    if image_to_video:  # noise and first-frame latents side by side
        config.update(in_channels=8, use_learned_positional_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = CogVideoXTransformer3DModel(**config)
        vae = AutoencoderKLCogVideoX(
            in_channels=3, out_channels=3, down_block_types=("CogVideoXDownBlock3D",) * 4,
            up_block_types=("CogVideoXUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8),
            latent_channels=4, layers_per_block=1, norm_num_groups=2,
            temporal_compression_ratio=4)
        text_encoder = T5EncoderModel(T5Config(  # gated FFN (wi_0, wi_1), as T5 v1.1-XXL
            vocab_size=384, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
            relative_attention_num_buckets=8, feed_forward_proj="gated-gelu"))
    cls = CogVideoXImageToVideoPipeline if image_to_video else CogVideoXPipeline
    return _in_eval(cls(tokenizer=ByT5Tokenizer(), text_encoder=text_encoder, vae=vae,
                        transformer=transformer, scheduler=CogVideoXDDIMScheduler()))


def _in_eval(pipe):
    """``pipe`` as ``from_pretrained`` gives it, every module in eval mode: a module
    built from its configuration starts in training mode, and T5's dropout would make
    two calls of the same pipeline differ."""
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            component.eval()
    return pipe
