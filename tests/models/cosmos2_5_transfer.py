"""A tiny random Cosmos 2.5 Transfer pipeline (configs as in diffusers' own Cosmos 2.5
Transfer tests; the VAE, text encoder and tokenizer of models.cosmos2_5_predict; the
pass-through safety checker of models.cosmos_safety). The transformer has
concat_padding_mask=False, as in models.cosmos2_5_predict, but the ControlNet always resizes
its padding mask with torchvision (controlnet_cosmos.py:201): without torchvision, as here,
the pipeline fails in plain diffusers too."""

import torch


def build_cosmos2_5_transfer_pipeline():
    # In plain diffusers (CPU, float32, no torchvision): pipe("a cat", controls=<5 32x32
    # frames>, height=32, width=32, num_frames=3, num_frames_per_chunk=16,
    # num_inference_steps=2, guidance_scale=3.0, max_sequence_length=16) fails with
    # NameError: name 'transforms' is not defined (controlnet_cosmos.py:201).
    from diffusers import (
        AutoencoderKLWan,
        Cosmos2_5_TransferPipeline,
        CosmosControlNetModel,
        CosmosTransformer3DModel,
        UniPCMultistepScheduler,
    )

    from models.cosmos2_5_predict import tiny_qwen2_5_vl
    from models.cosmos_safety import DummyCosmosSafetyChecker
    from models.easyanimate import qwen2_byte_tokenizer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = CosmosTransformer3DModel(
            in_channels=16 + 1, out_channels=16, num_attention_heads=2, attention_head_dim=16,
            num_layers=2, mlp_ratio=2, text_embed_dim=32, adaln_lora_dim=4,
            max_size=(4, 32, 32), patch_size=(1, 2, 2), rope_scale=(2.0, 1.0, 1.0),
            concat_padding_mask=False, extra_pos_embed_type="learnable",
            controlnet_block_every_n=1, img_context_dim_in=32, img_context_num_tokens=4,
            img_context_dim_out=32)
        torch.manual_seed(0)
        controlnet = CosmosControlNetModel(
            n_controlnet_blocks=2, in_channels=16 + 1 + 1, latent_channels=16 + 1 + 1,
            model_channels=32, num_attention_heads=2, attention_head_dim=16, mlp_ratio=2,
            text_embed_dim=32, adaln_lora_dim=4, patch_size=(1, 2, 2), max_size=(4, 32, 32),
            rope_scale=(2.0, 1.0, 1.0), extra_pos_embed_type="learnable",
            img_context_dim_in=32, img_context_dim_out=32, use_crossattn_projection=False)
        torch.manual_seed(0)
        vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                               temperal_downsample=[False, True, True])
        torch.manual_seed(0)
        text_encoder = tiny_qwen2_5_vl()
    for module in (transformer, controlnet, vae, text_encoder):
        module.eval()
    return Cosmos2_5_TransferPipeline(
        text_encoder=text_encoder, tokenizer=qwen2_byte_tokenizer(), transformer=transformer,
        vae=vae, scheduler=UniPCMultistepScheduler(), controlnet=controlnet,
        safety_checker=DummyCosmosSafetyChecker().eval())
