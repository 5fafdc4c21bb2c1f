"""A tiny random Cosmos (1.0) text-to-world pipeline (configs as in diffusers' own Cosmos
tests; the hub's tiny-random-t5 text encoder is rebuilt from its config in code, with a ByT5
tokenizer; the safety checker is the pass-through stand-in of models.cosmos_safety). Unlike
the tests' (and every real Cosmos checkpoint's) transformer, this one has
concat_padding_mask=False: with it True the transformer resizes its padding mask with
torchvision, which is not installed here (diffusers then fails with NameError: name
'transforms' is not defined, transformer_cosmos.py:735)."""

import torch


def tiny_t5():
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(  # hf-internal-testing/tiny-random-t5
        vocab_size=1103, d_model=32, d_kv=8, d_ff=37, num_layers=5, num_heads=4,
        relative_attention_num_buckets=8, initializer_factor=0.002))


def tiny_cosmos_vae():
    from diffusers import AutoencoderKLCosmos

    return AutoencoderKLCosmos(
        in_channels=3, out_channels=3, latent_channels=4, encoder_block_out_channels=(8,) * 4,
        decode_block_out_channels=(8,) * 4, attention_resolutions=(8,), resolution=64,
        num_layers=2, patch_size=4, patch_type="haar", scaling_factor=1.0,
        spatial_compression_ratio=4, temporal_compression_ratio=4)


def edm_scheduler():
    from diffusers import EDMEulerScheduler

    return EDMEulerScheduler(
        sigma_min=0.002, sigma_max=80, sigma_data=0.5, sigma_schedule="karras",
        num_train_timesteps=1000, prediction_type="epsilon", rho=7.0,
        final_sigmas_type="sigma_min")


def build_cosmos_text2world_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=32, width=32,
    # num_frames=9, num_inference_steps=2, guidance_scale=3.0, max_sequence_length=16,
    # output_type="np") gives 9 finite 32x32 frames.
    from diffusers import CosmosTextToWorldPipeline

    return cosmos_pipeline(CosmosTextToWorldPipeline, in_channels=4)


def cosmos_pipeline(cls, in_channels: int):
    """A tiny Cosmos (1.0) pipeline of class ``cls``; its transformer takes
    ``in_channels`` latent channels (video-to-world: 4 and the condition mask)."""
    from diffusers import CosmosTransformer3DModel
    from transformers import ByT5Tokenizer

    from models.cosmos_safety import DummyCosmosSafetyChecker

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = CosmosTransformer3DModel(
            in_channels=in_channels, out_channels=4, num_attention_heads=2,
            attention_head_dim=16, num_layers=2, mlp_ratio=2, text_embed_dim=32,
            adaln_lora_dim=4, max_size=(4, 32, 32), patch_size=(1, 2, 2),
            rope_scale=(2.0, 1.0, 1.0), concat_padding_mask=False,
            extra_pos_embed_type="learnable")
        torch.manual_seed(0)
        vae = tiny_cosmos_vae()
        torch.manual_seed(0)
        text_encoder = tiny_t5()
    for module in (transformer, vae, text_encoder):
        module.eval()
    return cls(
        text_encoder=text_encoder, tokenizer=ByT5Tokenizer(), transformer=transformer, vae=vae,
        scheduler=edm_scheduler(), safety_checker=DummyCosmosSafetyChecker().eval())
