"""A tiny random HunyuanVideo 1.5 image-to-video pipeline. diffusers has no test for it:
the components are those of the tiny HunyuanVideo 1.5 text-to-video pipeline
(porter_hunyuan's tiny.build_pipeline_15, shapes as in diffusers' own 1.5 tests) with the
transformer's task_type "i2v", plus a SiglipVisionModel built from a small config in code
(hidden size 12 = the transformer's image_embed_dim) and a SiglipImageProcessor built with
arguments."""

import torch


def build_hunyuan_video15_image_to_video_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(image=<16x16 image>, prompt="a cat",
    # num_frames=9, num_inference_steps=2, output_type="np") gives 9 finite 16x16 frames
    # (the pipeline takes no height/width: the image's size, fitted to the transformer's
    # target_size 16, sets them).
    from diffusers import (
        HunyuanVideo15ImageToVideoPipeline,
        HunyuanVideo15Transformer3DModel,
    )
    from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel

    from porter_hunyuan.tiny import build_pipeline_15

    components = build_pipeline_15().components
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = HunyuanVideo15Transformer3DModel(
            in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=8,
            num_layers=1, num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1,
            text_embed_dim=16, text_embed_2_dim=32, image_embed_dim=12,
            rope_axes_dim=(2, 2, 4), target_size=16, task_type="i2v")
        torch.manual_seed(0)
        image_encoder = SiglipVisionModel(SiglipVisionConfig(
            hidden_size=12, intermediate_size=16, num_attention_heads=2, num_hidden_layers=1,
            image_size=16, patch_size=4))
    for module in (transformer, image_encoder, components["vae"], components["text_encoder"],
                   components["text_encoder_2"]):
        module.eval()
    components.update(transformer=transformer, image_encoder=image_encoder,
                      feature_extractor=SiglipImageProcessor(size={"height": 16, "width": 16}))
    return HunyuanVideo15ImageToVideoPipeline(**components)
