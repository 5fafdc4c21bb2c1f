"""A tiny random distilled Helios pyramid pipeline: the pyramid test's components
(models.helios_pyramid) with the distilled model's scheduler (HeliosDMDScheduler), the
layout HeliosPyramidDistilledModularPipeline loads."""

import torch


def build_helios_pyramid_distilled_pipeline():
    from diffusers import HeliosDMDScheduler, HeliosPyramidPipeline

    from models.helios import helios_parts

    with torch.random.fork_rng(devices=[]):
        vae, text_encoder, tokenizer, transformer = helios_parts()
    return HeliosPyramidPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
        scheduler=HeliosDMDScheduler(use_dynamic_shifting=True, gamma=0.3))
