"""A tiny random Kandinsky 6 text/image-to-video-and-audio pipeline (configs as in diffusers'
own Kandinsky 6 tests). The hub's tiny-random-Qwen2VL processor is replaced by a byte-level
BPE Qwen2Tokenizer learned from the pipeline's own prompt template (as models.kandinsky5
builds one: the template's system part is 129 tokens, the pipeline's _QWEN_CROP_START) and
tiny-random-clip by a character-level CLIPTokenizer (models.kandinsky5)."""

import torch


def _splits():
    """Words of the prompt template that the real Qwen2.5 vocabulary splits in two (this
    template also writes "promt"): with them split, its part before the prompt is 129
    tokens long."""
    from models.kandinsky5 import _QWEN_SPLITS

    return {**_QWEN_SPLITS, "Ġpromt": ["Ġprom", "t"]}


def build_kandinsky6_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=16, width=16,
    # num_frames=5, num_inference_steps=2, guidance_scale=5.0, max_sequence_length=16,
    # output_type="np") gives 5 finite 16x16 frames (and audio, in .audio).
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        Kandinsky6TI2VAPipeline,
        Kandinsky6Transformer3DModel,
        MMAudioVAE,
        MMAudioVocoder,
    )
    from diffusers.pipelines.kandinsky6.pipeline_kandinsky6_ti2va import (
        _PROMPT_TEMPLATE,
        _QWEN_CROP_START,
    )

    from models.kandinsky5 import _clip_tokenizer, _qwen_tokenizer, text_encoders

    qwen_hidden_size, clip_hidden_size = 32, 16
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        vae = AutoencoderKLHunyuanVideo(
            act_fn="silu", block_out_channels=[8, 8, 8],
            down_block_types=["HunyuanVideoDownBlock3D"] * 3, in_channels=3, latent_channels=4,
            layers_per_block=1, mid_block_add_attention=False, norm_num_groups=2,
            out_channels=3, scaling_factor=0.476986, spatial_compression_ratio=8,
            temporal_compression_ratio=4, up_block_types=["HunyuanVideoUpBlock3D"] * 3)
        torch.manual_seed(0)
        audio_vae = MMAudioVAE(mel_bins=8, latent_channels=4, hidden_channels=8,
                               channel_multipliers=(1, 2), layers_per_block=1, sample_rate=64,
                               n_fft=16, hop_length=4)
        torch.manual_seed(0)
        vocoder = MMAudioVocoder(num_mels=8, upsample_initial_channel=8, upsample_rates=(2, 2),
                                 upsample_kernel_sizes=(4, 4), resblock_kernel_sizes=(3,),
                                 resblock_dilation_sizes=((1, 3),))
        text_encoder, text_encoder_2 = text_encoders(qwen_hidden_size, clip_hidden_size)
        torch.manual_seed(0)
        transformer = Kandinsky6Transformer3DModel(
            in_visual_dim=4, out_visual_dim=4, in_text_dim=qwen_hidden_size,
            in_text_dim2=clip_hidden_size, time_dim=16, patch_size=(1, 2, 2), model_dim=12,
            ff_dim=24, num_text_blocks=1, num_visual_blocks=2, axes_dims=(2, 1, 1),
            visual_cond=True, in_audio_dim=4, out_audio_dim=4,
            visual_token_type_num_embeddings=2)
    for module in (transformer, vae, audio_vae, vocoder, text_encoder, text_encoder_2):
        module.eval()
    return Kandinsky6TI2VAPipeline(
        transformer=transformer, vae=vae, text_encoder=text_encoder,
        tokenizer=_qwen_tokenizer(_PROMPT_TEMPLATE, _QWEN_CROP_START, _splits()),
        text_encoder_2=text_encoder_2, tokenizer_2=_clip_tokenizer(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), audio_vae=audio_vae,
        vocoder=vocoder)
