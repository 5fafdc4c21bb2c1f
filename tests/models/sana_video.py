"""A tiny random Sana-Video pipeline (configs as in diffusers' own Sana-Video tests; a
GemmaTokenizer built in code over the text encoder's 8-token vocabulary stands in for the
hub's hf-internal-testing/dummy-gemma one)."""

import torch


def build_sana_video_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=32, width=32, frames=9,
    # num_inference_steps=2, guidance_scale=6.0, max_sequence_length=16,
    # complex_human_instruction=[], use_resolution_binning=False, output_type="np") gives
    # 9 finite 32x32 frames. The vocabulary holds <pad> <eos> <bos> <unk> and "▁", "a", "c",
    # "t"; any other character is <unk>, so every prompt stays within the 8-token embedding.
    from diffusers import (
        AutoencoderKLWan,
        DPMSolverMultistepScheduler,
        SanaVideoPipeline,
        SanaVideoTransformer3DModel,
    )
    from transformers import Gemma2Config, Gemma2Model, GemmaTokenizer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                               temperal_downsample=[False, True, True])
        torch.manual_seed(0)
        text_encoder = Gemma2Model(Gemma2Config(
            head_dim=16, hidden_size=8, initializer_range=0.02, intermediate_size=64,
            max_position_embeddings=8192, model_type="gemma2", num_attention_heads=2,
            num_hidden_layers=1, num_key_value_heads=2, vocab_size=8,
            attn_implementation="eager"))
        torch.manual_seed(0)
        transformer = SanaVideoTransformer3DModel(
            in_channels=16, out_channels=16, num_attention_heads=2, attention_head_dim=12,
            num_layers=2, num_cross_attention_heads=2, cross_attention_head_dim=12,
            cross_attention_dim=24, caption_channels=8, mlp_ratio=2.5, dropout=0.0,
            attention_bias=False, sample_size=8, patch_size=(1, 2, 2),
            norm_elementwise_affine=False, norm_eps=1e-6, qk_norm="rms_norm_across_heads",
            rope_max_seq_len=32)
    for module in (transformer, vae, text_encoder):
        module.eval()
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "▁": 4, "a": 5, "c": 6, "t": 7}
    tokenizer = GemmaTokenizer(vocab=vocab, merges=[], add_bos_token=True, mask_token=None)
    return SanaVideoPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae,
                             transformer=transformer, scheduler=DPMSolverMultistepScheduler())
