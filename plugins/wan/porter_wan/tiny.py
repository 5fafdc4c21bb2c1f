"""Tiny random-weight Wan pipelines, built in code with no download.

Shapes follow the small configurations diffusers uses in its own Wan tests;
the tokenizer is byte-level (ByT5), so it needs no vocabulary files.
"""

from __future__ import annotations

import torch


def _transformer(**extra):
    from diffusers import WanTransformer3DModel
    config = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                  in_channels=16, out_channels=16, text_dim=32, freq_dim=256, ffn_dim=32,
                  num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                  rope_max_seq_len=32)
    return WanTransformer3DModel(**{**config, **extra})


def build_pipeline(seed: int = 0, experts: int = 1, boundary_ratio: float = 0.875,
                   transformer_config: dict | None = None):
    """Wan 2.1 (one transformer) or, with ``experts=2``, Wan 2.2's two-expert layout;
    ``transformer_config`` overrides the tiny transformer's configuration."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline
    from transformers import ByT5Tokenizer, UMT5Config, UMT5EncoderModel

    # Weights are random but reproducible: the same recipe gives the same model.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = _transformer(**(transformer_config or {}))
        vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                               temperal_downsample=[False, True, True])
        text_encoder = UMT5EncoderModel(UMT5Config(
            vocab_size=384, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
            relative_attention_num_buckets=8))
        transformer_2 = _transformer(**(transformer_config or {})) if experts == 2 else None
    return WanPipeline(tokenizer=ByT5Tokenizer(), text_encoder=text_encoder,
                       transformer=transformer, vae=vae,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
                       transformer_2=transformer_2,
                       boundary_ratio=boundary_ratio if experts == 2 else None)


def build_i2v_pipeline(seed: int = 0):
    """Wan 2.1 image-to-video: 36 input channels (noise + mask + first-frame latents)
    and a tiny CLIP vision encoder whose image processor needs no files."""
    from diffusers import (AutoencoderKLWan, FlowMatchEulerDiscreteScheduler,
                           WanImageToVideoPipeline)
    import transformers
    from transformers import (ByT5Tokenizer, CLIPVisionConfig, CLIPVisionModel, UMT5Config,
                              UMT5EncoderModel)

    # transformers 5 splits the processor by backend; the PIL one needs no torchvision
    CLIPImageProcessor = getattr(transformers, "CLIPImageProcessorPil",
                                 transformers.CLIPImageProcessor)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = _transformer(in_channels=36, image_dim=4)
        vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                               temperal_downsample=[False, True, True])
        text_encoder = UMT5EncoderModel(UMT5Config(
            vocab_size=384, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
            relative_attention_num_buckets=8))
        image_encoder = CLIPVisionModel(CLIPVisionConfig(
            hidden_size=4, projection_dim=4, num_hidden_layers=2, num_attention_heads=2,
            image_size=32, intermediate_size=16, patch_size=4))
    processor = CLIPImageProcessor(crop_size=32, do_center_crop=True, do_normalize=True,
                                   do_resize=True, image_mean=[0.48145466, 0.4578275, 0.40821073],
                                   image_std=[0.26862954, 0.26130258, 0.27577711],
                                   resample=3, size=32)
    return WanImageToVideoPipeline(tokenizer=ByT5Tokenizer(), text_encoder=text_encoder,
                                   transformer=transformer, vae=vae,
                                   scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
                                   image_processor=processor, image_encoder=image_encoder)
