"""A tiny random Cosmos 2 video-to-world pipeline (configs as in diffusers' own Cosmos 2
video-to-world tests; the tiny-random-t5 text encoder and ByT5 tokenizer of
models.cosmos_text2world; concat_padding_mask=False and the pass-through safety checker as
there)."""

import torch


def build_cosmos2_video2world_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(image=<32x32 image>, prompt="a cat",
    # height=32, width=32, num_frames=9, num_inference_steps=2, guidance_scale=3.0,
    # max_sequence_length=16, output_type="np") gives 9 finite 32x32 frames.
    from diffusers import (
        AutoencoderKLWan,
        Cosmos2VideoToWorldPipeline,
        CosmosTransformer3DModel,
        FlowMatchEulerDiscreteScheduler,
    )
    from transformers import ByT5Tokenizer

    from models.cosmos_safety import DummyCosmosSafetyChecker
    from models.cosmos_text2world import tiny_t5

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = CosmosTransformer3DModel(
            in_channels=16 + 1, out_channels=16, num_attention_heads=2, attention_head_dim=16,
            num_layers=2, mlp_ratio=2, text_embed_dim=32, adaln_lora_dim=4,
            max_size=(4, 32, 32), patch_size=(1, 2, 2), rope_scale=(2.0, 1.0, 1.0),
            concat_padding_mask=False, extra_pos_embed_type="learnable")
        torch.manual_seed(0)
        vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                               temperal_downsample=[False, True, True])
        torch.manual_seed(0)
        text_encoder = tiny_t5()
    for module in (transformer, vae, text_encoder):
        module.eval()
    return Cosmos2VideoToWorldPipeline(
        text_encoder=text_encoder, tokenizer=ByT5Tokenizer(), transformer=transformer, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(use_karras_sigmas=True),
        safety_checker=DummyCosmosSafetyChecker().eval())
