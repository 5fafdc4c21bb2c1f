"""A tiny random Cosmos 2.5 Predict pipeline (configs as in diffusers' own Cosmos 2.5 tests;
the hub's tiny-random-Qwen2VL tokenizer is replaced by a byte-level Qwen2Tokenizer with a
chat template, built in code (models.easyanimate); the safety checker is the pass-through
stand-in of models.cosmos_safety). The transformer has concat_padding_mask=False, unlike the
tests' and the real checkpoints': True needs torchvision, not installed here."""

import torch


def tiny_qwen2_5_vl(hidden_size: int = 16):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
        text_config={
            "hidden_size": hidden_size, "intermediate_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 2,
            "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default",
                             "type": "default"},
            "rope_theta": 1000000.0},
        vision_config={"depth": 2, "hidden_size": hidden_size, "intermediate_size": 16,
                       "num_heads": 2, "out_hidden_size": hidden_size},
        hidden_size=hidden_size, vocab_size=152064, vision_end_token_id=151653,
        vision_start_token_id=151652, vision_token_id=151654))


def cosmos2_5_parts():
    """transformer, vae, text encoder, seeded as in the diffusers tests."""
    from diffusers import AutoencoderKLWan, CosmosTransformer3DModel

    torch.manual_seed(0)
    transformer = CosmosTransformer3DModel(
        in_channels=16 + 1, out_channels=16, num_attention_heads=2, attention_head_dim=16,
        num_layers=2, mlp_ratio=2, text_embed_dim=32, adaln_lora_dim=4, max_size=(4, 32, 32),
        patch_size=(1, 2, 2), rope_scale=(2.0, 1.0, 1.0), concat_padding_mask=False,
        extra_pos_embed_type="learnable")
    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    torch.manual_seed(0)
    text_encoder = tiny_qwen2_5_vl()
    for module in (transformer, vae, text_encoder):
        module.eval()
    return transformer, vae, text_encoder


def build_cosmos2_5_predict_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=32, width=32,
    # num_frames=3, num_inference_steps=2, guidance_scale=3.0, max_sequence_length=16,
    # output_type="np") gives 3 finite 32x32 frames (text-to-world: no image, no video).
    from diffusers import Cosmos2_5_PredictBasePipeline, UniPCMultistepScheduler

    from models.cosmos_safety import DummyCosmosSafetyChecker
    from models.easyanimate import qwen2_byte_tokenizer

    with torch.random.fork_rng(devices=[]):
        transformer, vae, text_encoder = cosmos2_5_parts()
    return Cosmos2_5_PredictBasePipeline(
        text_encoder=text_encoder, tokenizer=qwen2_byte_tokenizer(), transformer=transformer,
        vae=vae, scheduler=UniPCMultistepScheduler(),
        safety_checker=DummyCosmosSafetyChecker().eval())
