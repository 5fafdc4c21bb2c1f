"""A tiny random Motif-Video image-to-video pipeline (configs as in diffusers' own Motif-Video
image-to-video tests: a T5Gemma2 encoder with a tiny SigLIP vision tower, its image processor
built with arguments, and a ByT5 tokenizer built in code for the hub's tiny-random-t5 one)."""

import torch


def build_motif_video_i2v_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(image=<16x16 image>, prompt="a cat",
    # height=16, width=16, num_frames=9, num_inference_steps=2, max_sequence_length=16,
    # output_type="np") gives 9 finite 16x16 frames.
    from diffusers import FlowMatchEulerDiscreteScheduler, MotifVideoImage2VideoPipeline
    from diffusers.guiders import AdaptiveProjectedGuidance
    from transformers import ByT5Tokenizer, SiglipImageProcessor

    from models.motif_video import tiny_motif_parts

    with torch.random.fork_rng(devices=[]):
        vae, text_encoder, transformer = tiny_motif_parts(in_channels=33, image_embed_dim=4)
    return MotifVideoImage2VideoPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), vae=vae,
        text_encoder=text_encoder, tokenizer=ByT5Tokenizer(), transformer=transformer,
        guider=AdaptiveProjectedGuidance(),
        feature_extractor=SiglipImageProcessor(image_mean=[0.5, 0.5, 0.5],
                                               image_std=[0.5, 0.5, 0.5],
                                               size={"height": 16, "width": 16}))
