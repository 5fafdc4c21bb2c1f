"""A tiny random EasyAnimate pipeline (configs as in diffusers' own EasyAnimate tests). The
hub's tiny-random-Qwen2VLForConditionalGeneration text encoder is rebuilt from a small config
in code (hidden size 16, the transformer's text_embed_dim), with a byte-level Qwen2Tokenizer
(one token per byte, no merges) and a Qwen2-style chat template built in code."""

import torch

#: the Qwen2 chat template, enough for the messages diffusers builds: a list of content
#: parts of type "text"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def qwen2_byte_tokenizer(chat_template: str | None = CHAT_TEMPLATE, extra_special=()):
    """A Qwen2Tokenizer with one token per byte (ids 0-255) and the special tokens
    <|endoftext|> <|im_start|> <|im_end|> (256-258), then ``extra_special``: any text encoder
    with a vocabulary over 259 (plus the extra ones) takes its ids."""
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Tokenizer

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *extra_special]
    chars = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(chars)}
    vocab.update({s: len(chars) + i for i, s in enumerate(special)})
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[])
    tokenizer.add_special_tokens({"additional_special_tokens": special[1:]})
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def tiny_qwen2vl(hidden_size: int = 16):
    """A two-layer Qwen2-VL (in place of tiny-random-Qwen2VLForConditionalGeneration) over
    a 300-token vocabulary; its vision token ids are never produced by the byte tokenizer."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    head_dim = hidden_size // 2
    quarter = head_dim // 4
    return Qwen2VLForConditionalGeneration(Qwen2VLConfig(
        text_config={
            "hidden_size": hidden_size, "intermediate_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 300,
            "max_position_embeddings": 512, "bos_token_id": 256, "eos_token_id": 256,
            "rope_scaling": {"mrope_section": [quarter, quarter, head_dim // 2 - 2 * quarter],
                             "rope_type": "default", "type": "default"},
            "rope_theta": 1000000.0},
        vision_config={"depth": 1, "embed_dim": 16, "hidden_size": hidden_size, "num_heads": 2},
        image_token_id=296, video_token_id=297, vision_start_token_id=298,
        vision_end_token_id=299))


def easyanimate_parts(in_channels: int = 4, **transformer_config):
    """transformer, vae and text encoder, seeded as in the diffusers tests."""
    from diffusers import EasyAnimateTransformer3DModel

    torch.manual_seed(0)
    transformer = EasyAnimateTransformer3DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=in_channels, out_channels=4,
        time_embed_dim=2, text_embed_dim=16, num_layers=1, sample_width=16, sample_height=16,
        patch_size=2, **transformer_config)
    torch.manual_seed(0)
    vae = tiny_magvit()
    torch.manual_seed(0)
    text_encoder = tiny_qwen2vl()
    for module in (transformer, vae, text_encoder):
        module.eval()
    return transformer, vae, text_encoder


def build_easyanimate_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=16, width=16,
    # num_frames=5, num_inference_steps=2, guidance_scale=6.0, output_type="np") gives
    # 5 finite 16x16 frames. The prompt is padded to 256 tokens (encode_prompt's default).
    from diffusers import EasyAnimatePipeline, FlowMatchEulerDiscreteScheduler

    with torch.random.fork_rng(devices=[]):
        transformer, vae, text_encoder = easyanimate_parts()
    return EasyAnimatePipeline(vae=vae, text_encoder=text_encoder,
                               tokenizer=qwen2_byte_tokenizer(), transformer=transformer,
                               scheduler=FlowMatchEulerDiscreteScheduler())


def tiny_magvit():
    from diffusers import AutoencoderKLMagvit

    return AutoencoderKLMagvit(
        in_channels=3, out_channels=3,
        down_block_types=("SpatialDownBlock3D",) + ("SpatialTemporalDownBlock3D",) * 3,
        up_block_types=("SpatialUpBlock3D",) + ("SpatialTemporalUpBlock3D",) * 3,
        block_out_channels=(8, 8, 8, 8), latent_channels=4, layers_per_block=1,
        norm_num_groups=2, spatial_group_norm=False)
