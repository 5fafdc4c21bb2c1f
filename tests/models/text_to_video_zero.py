"""A tiny random Text2Video-Zero pipeline. diffusers has no fast test for it (only a slow one
on Stable Diffusion 1.5), so its components are the SD 1.5-like ones of the AnimateDiff tests
without the motion adapter (see models.animatediff), and a tiny random safety checker: the
pipeline does not list safety_checker and feature_extractor as optional components, so a pipeline
saved without them does not load (DiffusionPipeline.from_pretrained: "expected [...] but only
[...] were passed"). The random checker flags nothing (its concept embeddings are all ones, so
no cosine score exceeds the threshold)."""

import torch

from .animatediff import animatediff_components


def safety_checker():
    """A tiny random StableDiffusionSafetyChecker and the CLIPImageProcessor that feeds it."""
    from diffusers.pipelines.stable_diffusion.safety_checker import (
        StableDiffusionSafetyChecker,
    )
    from transformers import CLIPConfig, CLIPImageProcessor

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        checker = StableDiffusionSafetyChecker(CLIPConfig(
            text_config={"hidden_size": 32, "intermediate_size": 37, "num_attention_heads": 4,
                         "num_hidden_layers": 2, "vocab_size": 1000},
            vision_config={"hidden_size": 32, "intermediate_size": 37,
                           "num_attention_heads": 4, "num_hidden_layers": 2,
                           "image_size": 32, "patch_size": 4},
            projection_dim=32)).eval()
    return checker, CLIPImageProcessor(size={"shortest_edge": 32},
                                       crop_size={"height": 32, "width": 32})


def build_text_to_video_zero_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=16, width=16,
    # video_length=2, num_inference_steps=3, guidance_scale=7.5, t0=0, t1=1,
    # output_type="np").images is 2 finite 16x16 frames (t0 and t1 index the timesteps
    # from the end: their defaults 44 and 47 need 48 steps or more).
    from diffusers import TextToVideoZeroPipeline

    components = animatediff_components()
    checker, feature_extractor = safety_checker()
    return TextToVideoZeroPipeline(
        vae=components["vae"], text_encoder=components["text_encoder"],
        tokenizer=components["tokenizer"], unet=components["unet"],
        scheduler=components["scheduler"], safety_checker=checker,
        feature_extractor=feature_extractor)
