"""A tiny random LTX-2 pipeline (configs as in diffusers' own LTX-2 tests, whose shared
component builder all LTX-2 pipelines use). The hub's hf-internal-testing/tiny-gemma3 text
encoder is replaced by a Gemma3ForConditionalGeneration built from a small config in code,
and its tokenizer by a GemmaTokenizer over an 8-token vocabulary (as in sana_video.py)."""

import torch

TEXT_HIDDEN, TEXT_LAYERS = 32, 2  # the connectors are 4 heads of 8 wide: 32


def _gemma3():
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, GemmaTokenizer

    encoder = Gemma3ForConditionalGeneration(Gemma3Config(
        text_config={"hidden_size": TEXT_HIDDEN, "intermediate_size": 32,
                     "num_hidden_layers": TEXT_LAYERS, "num_attention_heads": 2,
                     "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 8,
                     "sliding_window": 8, "max_position_embeddings": 512},
        vision_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 16, "patch_size": 4},
        mm_tokens_per_image=4, image_token_index=7, boi_token_index=5, eoi_token_index=6))
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "▁": 4, "a": 5, "c": 6, "t": 7}
    tokenizer = GemmaTokenizer(vocab=vocab, merges=[], add_bos_token=True, mask_token=None)
    return encoder, tokenizer


def ltx2_components(transformer_kwargs=None, keyframe_embedding=False):
    """The components every LTX-2 pipeline takes (each module in eval mode)."""
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        text_encoder, tokenizer = _gemma3()
        torch.manual_seed(0)
        transformer = LTX2VideoTransformer3DModel(
            in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2,
            attention_head_dim=8, cross_attention_dim=16, audio_in_channels=4,
            audio_out_channels=4, audio_num_attention_heads=2, audio_attention_head_dim=4,
            audio_cross_attention_dim=8, num_layers=2, qk_norm="rms_norm_across_heads",
            caption_channels=TEXT_HIDDEN, rope_double_precision=False, rope_type="split",
            **(transformer_kwargs or {}))
        if keyframe_embedding:
            torch.nn.init.normal_(transformer.keyframes_abs_pos_embedding, std=0.1)
        torch.manual_seed(0)
        connectors = LTX2TextConnectors(
            caption_channels=TEXT_HIDDEN, text_proj_in_factor=TEXT_LAYERS + 1,
            video_connector_num_attention_heads=4, video_connector_attention_head_dim=8,
            video_connector_num_layers=1, video_connector_num_learnable_registers=None,
            audio_connector_num_attention_heads=4, audio_connector_attention_head_dim=8,
            audio_connector_num_layers=1, audio_connector_num_learnable_registers=None,
            connector_rope_base_seq_len=32, rope_theta=10000.0, rope_double_precision=False,
            causal_temporal_positioning=False, rope_type="split")
        torch.manual_seed(0)
        vae = AutoencoderKLLTX2Video(
            in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8,),
            decoder_block_out_channels=(8,), layers_per_block=(1,),
            decoder_layers_per_block=(1, 1), spatio_temporal_scaling=(True,),
            decoder_spatio_temporal_scaling=(True,), decoder_inject_noise=(False, False),
            downsample_type=("spatial",), upsample_residual=(False,), upsample_factor=(1,),
            timestep_conditioning=False, patch_size=1, patch_size_t=1, encoder_causal=True,
            decoder_causal=False)
        vae.use_framewise_encoding = False
        vae.use_framewise_decoding = False
        torch.manual_seed(0)
        audio_vae = AutoencoderKLLTX2Audio(
            base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1,
            attn_resolutions=None, in_channels=2, resolution=32, latent_channels=2,
            norm_type="pixel", causality_axis="height", dropout=0.0,
            mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160,
            is_causal=True, mel_bins=8)
        torch.manual_seed(0)
        vocoder = LTX2Vocoder(
            in_channels=2 * 8, hidden_channels=32, out_channels=2, upsample_kernel_sizes=[4, 4],
            upsample_factors=[2, 2], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]],
            leaky_relu_negative_slope=0.1, output_sampling_rate=16000)
    for module in (text_encoder, transformer, connectors, vae, audio_vae, vocoder):
        module.eval()
    return {"transformer": transformer, "vae": vae, "audio_vae": audio_vae,
            "scheduler": FlowMatchEulerDiscreteScheduler(), "text_encoder": text_encoder,
            "tokenizer": tokenizer, "connectors": connectors, "vocoder": vocoder}


def build_ltx2_pipeline():
    # Checked in plain diffusers (CPU, float32): see the LTX2Pipeline entry's call.
    from diffusers import LTX2Pipeline

    return LTX2Pipeline(**ltx2_components())
