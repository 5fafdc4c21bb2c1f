"""A tiny random MiniMax-H3 modular pipeline (MiniMaxH3ModularPipeline: joint video and stereo
audio, modular only). The transformer, the video VAE and the audio VAE take the configs of
diffusers' own model tests (test_models_transformer_minimax_h3, test_models_autoencoder_kl_
minimax_h3[_audio]), resized as diffusers' modular test describes its tiny hub repository
(four latent channels, a 16x spatial / 4x temporal video VAE so a 32 pixel canvas is one patch
row a latent frame, an audio VAE of 8 latent channels hopping 4 samples at 160 Hz: 40 latents
a second). The Qwen3-VL conditioner follows transformers' Qwen3-VL test config, but with 51
decoder layers (MiniMax-H3 reads hidden_states[50]), 8 wide (the transformer test's
text_dim); its tokenizer is the byte-level Qwen2 tokenizer of models.easyanimate with the
Qwen-VL vision tokens, and its processor leaves out the video processor (see
Qwen3VLProcessorWithoutVideo: no torchvision here). ``transformer_ref`` (the ref2va half) is a
second tiny transformer. Pipeline configs shrink the default canvas and the reference short
edge, as diffusers' modular test does. Saved as a modular checkpoint."""

import torch
from transformers import Qwen3VLProcessor

from models.easyanimate import qwen2_byte_tokenizer

#: the Qwen-VL vision tokens, after the byte tokenizer's 256 bytes and three specials
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
TEXT_HIDDEN = 8
TEXT_LAYERS = 51  # MiniMax-H3 conditions on hidden_states[50]


class Qwen3VLProcessorWithoutVideo(Qwen3VLProcessor):
    """Qwen3VLProcessor without its video processor. transformers cannot build (nor load) a
    Qwen3VLProcessor without torchvision, not installed here: its class check of the video
    processor fails. The MiniMax-H3 blocks use the processor's image processor and
    create_mm_token_type_ids alone, except for a video reference (ref2va), which needs
    torchvision anyway. Saved by diffusers under this module's path, and loaded back from it
    (diffusers resolves a library it does not know from sys.modules)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        # the sub-processors are this class's __init__ arguments: image_processor, tokenizer
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


def tiny_qwen3vl():
    """A Qwen3-VL conditioner (after transformers' test config: 51 layers of width 8) and its
    tokenizer and processor."""
    from transformers import (
        Qwen2VLImageProcessorPil,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
    )

    tokenizer = qwen2_byte_tokenizer(chat_template=None, extra_special=VISION_TOKENS)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in VISION_TOKENS}
    encoder = Qwen3VLForConditionalGeneration(Qwen3VLConfig(
        text_config={
            "hidden_size": TEXT_HIDDEN, "intermediate_size": 16, "num_hidden_layers": TEXT_LAYERS,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
            "vocab_size": 272, "max_position_embeddings": 4096, "bos_token_id": 256,
            "eos_token_id": 256, "pad_token_id": 256, "rope_theta": 10000,
            "rope_parameters": {"rope_type": "default", "mrope_section": [1, 1, 0],
                                "mrope_interleaved": True}},
        vision_config={
            "depth": 1, "hidden_size": 16, "intermediate_size": 16, "out_hidden_size": TEXT_HIDDEN,
            "num_heads": 2, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
            "num_position_embeddings": 16, "deepstack_visual_indexes": [0]},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"]))
    size = {"shortest_edge": 32 * 32, "longest_edge": 64 * 64}
    processor = Qwen3VLProcessorWithoutVideo(
        image_processor=Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, size=size),
        tokenizer=tokenizer)
    return encoder, tokenizer, processor


def minimax_h3_transformer():
    from diffusers import MiniMaxH3Transformer3DModel

    return MiniMaxH3Transformer3DModel(
        num_attention_heads=2, attention_head_dim=16, hidden_size=24, num_layers=2,
        num_refiner_layers=2, ffn_dim=32, in_channels=4, audio_in_channels=8,
        patch_size=(1, 2, 2), text_dim=TEXT_HIDDEN, freq_dim=8, time_embed_hidden_dim=24,
        time_embed_dim=16, rope_freq_dim=2)


def build_minimax_h3_pipeline():
    from diffusers import (
        AutoencoderKLMiniMaxH3,
        AutoencoderKLMiniMaxH3Audio,
        MiniMaxH3ModularPipeline,
        MiniMaxH3Scheduler,
    )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        text_encoder, tokenizer, processor = tiny_qwen3vl()
        torch.manual_seed(0)
        transformer = minimax_h3_transformer()
        torch.manual_seed(1)
        transformer_ref = minimax_h3_transformer()
        torch.manual_seed(0)
        vae = AutoencoderKLMiniMaxH3(
            in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 8, 8, 8),
            layers_per_block=1, spatial_downsample_factors=(2, 2, 2, 2),
            temporal_downsample_factors=(1, 2, 2, 1), norm_num_groups=4,
            decoder_num_layers=2, decoder_num_attention_heads=2, decoder_attention_head_dim=8,
            decoder_num_register_tokens=2, decoder_ffn_mult=2, clip_length=17, token_drop=3,
            latents_mean=(0.0,) * 4, latents_std=(1.0,) * 4)
        torch.manual_seed(0)
        audio_vae = AutoencoderKLMiniMaxH3Audio(
            encoder_dim=4, encoder_rates=(2, 2), latent_dim=32, latent_channels=8,
            num_attention_heads=2, decoder_dim=16, decoder_rates=(2, 2),
            decoder_kernel_sizes=(4, 4), resblock_kernel_sizes=(3, 7),
            resblock_dilation_sizes=((1, 3), (1, 3)), sampling_rate=160,
            latents_mean=[0.0] * 8, latents_std=[1.0] * 8)
    for module in (text_encoder, transformer, transformer_ref, vae, audio_vae):
        module.eval()
    pipe = MiniMaxH3ModularPipeline()
    pipe.update_components(
        text_encoder=text_encoder, tokenizer=tokenizer, processor=processor, vae=vae,
        audio_vae=audio_vae, transformer=transformer, transformer_ref=transformer_ref,
        scheduler=MiniMaxH3Scheduler(shift=12.0), audio_scheduler=MiniMaxH3Scheduler(shift=3.0),
        canvas_short_edge=32, canvas_max_pixels=32 * 64, reference_image_short_edge=64)
    return pipe
