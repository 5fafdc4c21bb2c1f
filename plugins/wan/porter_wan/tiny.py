"""Tiny random-weight Wan pipelines, built in code with no download.

Shapes follow the small configurations diffusers uses in its own Wan tests
(``tests/pipelines/wan/``); the tokenizer is byte-level (ByT5), so it needs no
vocabulary files. One builder covers every layout (``VARIANTS``).
"""

from __future__ import annotations

from porter.shims import lazy
from porter_wan.layout import Layout

torch = lazy.module("torch", __name__)

#: the tiny transformer every variant starts from
TRANSFORMER = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                   in_channels=16, out_channels=16, text_dim=32, freq_dim=256, ffn_dim=32,
                   num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                   rope_max_seq_len=32)
#: the tiny CLIP image encoder: 32x32 pixels in patches of 4, so 65 tokens an image
CLIP = dict(hidden_size=4, projection_dim=4, num_hidden_layers=2, num_attention_heads=2,
            image_size=32, intermediate_size=16, patch_size=4)
CLIP_TOKENS = (32 // 4) ** 2 + 1
#: Wan 2.2's 48-channel VAE at test size: 16x spatial compression
VAE_48 = dict(base_dim=3, z_dim=48, in_channels=12, out_channels=12, is_residual=True,
              patch_size=2, latents_mean=[0.0] * 48, latents_std=[1.0] * 48,
              dim_mult=[1, 1, 1, 1], num_res_blocks=1, scale_factor_spatial=16,
              scale_factor_temporal=4, temperal_downsample=[False, True, True])
VAE_16 = dict(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
              temperal_downsample=[False, True, True])

#: variant -> transformer changes, experts, pipeline settings, VAE, CLIP encoder
VARIANTS = {
    # Wan 2.1 text-to-video
    "t2v": dict(),
    # Wan 2.2 T2V-A14B: two experts switching at the boundary
    "t2v-two-experts": dict(experts=2, pipeline={"boundary_ratio": 0.875}),
    # Wan 2.1 image-to-video: noise + mask + first-frame latents, and CLIP image tokens
    "i2v": dict(transformer={"in_channels": 36, "image_dim": 4}, clip=True),
    # Wan 2.2 I2V-A14B: the first frame as latents only, two experts
    "i2v-two-experts": dict(transformer={"in_channels": 36}, experts=2,
                            pipeline={"boundary_ratio": 0.875}),
    # Wan 2.2 TI2V-5B: 48 latent channels, per-token timesteps, text or image to video
    "ti2v": dict(transformer={"in_channels": 48, "out_channels": 48}, vae=VAE_48,
                 pipeline={"expand_timesteps": True}),
    # Wan 2.1 FLF2V: first and last frame, their CLIP tokens with a position embedding
    "flf2v": dict(transformer={"in_channels": 36, "image_dim": 4,
                               "pos_embed_seq_len": 2 * CLIP_TOKENS}, clip=True),
}


def _spec(variant: str | None) -> dict:
    return VARIANTS[variant or "t2v"]


def transformer_config(variant: str | None, overrides: dict | None = None) -> dict:
    return {**TRANSFORMER, **_spec(variant).get("transformer", {}), **(overrides or {})}


def layout(variant: str | None, overrides: dict | None = None) -> Layout:
    spec = _spec(variant)
    return Layout.from_configs(spec.get("pipeline", {}), transformer_config(variant, overrides),
                               spec.get("vae", VAE_16))


def build(variant: str | None = None, image: bool = False, seed: int = 0,
          transformer_config_overrides: dict | None = None):
    """The tiny pipeline of ``variant``; ``image``: as WanImageToVideoPipeline (always
    for the layouts that need an image)."""
    from diffusers import (
        AutoencoderKLWan,
        WanImageToVideoPipeline,
        WanPipeline,
        WanTransformer3DModel,
    )
    from transformers import ByT5Tokenizer, UMT5Config, UMT5EncoderModel

    spec = _spec(variant)
    config = transformer_config(variant, transformer_config_overrides)
    # Weights are random but reproducible: the same recipe gives the same model.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = WanTransformer3DModel(**config)
        vae = AutoencoderKLWan(**spec.get("vae", VAE_16))
        text_encoder = UMT5EncoderModel(UMT5Config(
            vocab_size=384, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
            relative_attention_num_buckets=8))
        extra = {}
        if spec.get("clip"):
            extra = _clip()
        transformer_2 = WanTransformer3DModel(**config) if spec.get("experts") == 2 else None
    common = dict(tokenizer=ByT5Tokenizer(), text_encoder=text_encoder, transformer=transformer,
                  vae=vae, scheduler=scheduler(),
                  transformer_2=transformer_2, **spec.get("pipeline", {}))
    if image or layout(variant, transformer_config_overrides).needs_image:
        extra.setdefault("image_encoder", None)
        extra.setdefault("image_processor", None)
        return _in_eval(WanImageToVideoPipeline(**common, **extra))
    return _in_eval(WanPipeline(**common))


def _in_eval(pipe):
    """``pipe`` as ``from_pretrained`` gives it, every module in eval mode: a module
    built from its configuration starts in training mode, and UMT5's dropout made two
    calls of the same pipeline differ (by 2.7e-2 to 0.58 in the final latents)."""
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            component.eval()
    return pipe


def scheduler():
    """The tiny pipelines' scheduler."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(shift=7.0)


def _clip() -> dict:
    """A tiny CLIP vision encoder and an image processor that needs no files."""
    import transformers
    from transformers import CLIPVisionConfig, CLIPVisionModel

    # transformers 5 splits the processor by backend; the PIL one needs no torchvision
    processor_class = getattr(transformers, "CLIPImageProcessorPil",
                              transformers.CLIPImageProcessor)
    processor = processor_class(crop_size=32, do_center_crop=True, do_normalize=True,
                                do_resize=True, image_mean=[0.48145466, 0.4578275, 0.40821073],
                                image_std=[0.26862954, 0.26130258, 0.27577711], resample=3,
                                size=32)
    return {"image_encoder": CLIPVisionModel(CLIPVisionConfig(**CLIP)),
            "image_processor": processor}


def build_pipeline(seed: int = 0, experts: int = 1, transformer_config: dict | None = None):
    """Wan 2.1 text-to-video or, with ``experts=2``, Wan 2.2's two-expert layout."""
    return build("t2v-two-experts" if experts == 2 else "t2v", seed=seed,
                 transformer_config_overrides=transformer_config)


def build_i2v_pipeline(seed: int = 0):
    """Wan 2.1 image-to-video with its tiny CLIP encoder."""
    return build("i2v", image=True, seed=seed)
