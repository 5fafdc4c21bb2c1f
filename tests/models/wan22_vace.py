"""A tiny random Wan 2.2 VACE pipeline: the Wan VACE test's components (models.wan_vace)
with a second expert and Wan 2.2's boundary, as WanVACEPipeline takes them; the layout
Wan22VaceModularPipeline loads."""

import torch


def build_wan22_vace_pipeline():
    from diffusers import WanVACEPipeline

    from models.wan_vace import build_wan_vace_pipeline

    first = build_wan_vace_pipeline()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        second = type(first.transformer)(**first.transformer.config).eval()
    return WanVACEPipeline(tokenizer=first.tokenizer, text_encoder=first.text_encoder,
                           vae=first.vae, scheduler=first.scheduler,
                           transformer=first.transformer, transformer_2=second,
                           boundary_ratio=0.875)
