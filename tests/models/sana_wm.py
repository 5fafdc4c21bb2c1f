"""A tiny random SANA-WM camera-controlled image-to-video pipeline. diffusers' own tests build
none (they test its helpers only), so the components are chosen here: the one-block LTX-2
VAE of diffusers' LTX-2 tests (2x spatial and temporal compression, 4 latent channels), the
Gemma-2 text encoder and in-code GemmaTokenizer of models.sana_video, and a two-block
SanaWMTransformer3DModel whose chunk Plucker channels are 6 x the VAE's temporal stride."""

import torch


def build_sana_wm_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(<32x32 image>, "a cat", action="w-8",
    # intrinsics=[16.0, 16.0, 16.0, 16.0], height=32, width=32, num_frames=9,
    # num_inference_steps=2, max_sequence_length=8, chi_prompt=[], output_type="np") gives
    # 9 finite 32x32 frames, in .frames with no batch axis: (9, 32, 32, 3).
    from diffusers import (
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        SanaWMPipeline,
        SanaWMTransformer3DModel,
    )
    from transformers import Gemma2Config, Gemma2Model, GemmaTokenizer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        vae = AutoencoderKLLTX2Video(
            in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8,),
            decoder_block_out_channels=(8,), layers_per_block=(1,),
            decoder_layers_per_block=(1, 1), spatio_temporal_scaling=(True,),
            decoder_spatio_temporal_scaling=(True,), decoder_inject_noise=(False, False),
            downsample_type=("spatial",), upsample_residual=(False,), upsample_factor=(1,),
            timestep_conditioning=False, patch_size=1, patch_size_t=1, encoder_causal=True,
            decoder_causal=False)
        torch.manual_seed(0)
        text_encoder = Gemma2Model(Gemma2Config(
            head_dim=16, hidden_size=8, initializer_range=0.02, intermediate_size=64,
            max_position_embeddings=8192, model_type="gemma2", num_attention_heads=2,
            num_hidden_layers=1, num_key_value_heads=2, vocab_size=8,
            attn_implementation="eager"))
        torch.manual_seed(0)
        transformer = SanaWMTransformer3DModel(
            in_channels=4, num_layers=2, hidden_size=32, num_attention_heads=2,
            linear_head_dim=16, softmax_every_n=2, chunk_plucker_channels=6 * 2,
            chunk_plucker_post_attn_blocks=2, caption_channels=8, image_size=32,
            mixed_precision="fp32")
    for module in (transformer, vae, text_encoder):
        module.eval()
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "▁": 4, "a": 5, "c": 6, "t": 7}
    tokenizer = GemmaTokenizer(vocab=vocab, merges=[], add_bos_token=True, mask_token=None)
    return SanaWMPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae,
                          transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler())
