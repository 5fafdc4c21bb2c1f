"""A tiny random Kandinsky 5 text-to-video pipeline (configs as in diffusers' own Kandinsky 5
tests). The hub tokenizers are replaced by ones built in code: a byte-level BPE Qwen2Tokenizer
whose vocabulary is learned from the pipeline's own prompt template, in place of the
tiny-random-Qwen2VL processor, and a byte-level CLIPTokenizer, in place of tiny-random-clip."""

import json
import re

import torch

# Words of the prompt template that the real Qwen2.5 vocabulary splits in two; with them
# split, the template's system part plus "<|im_start|>user\n" is 128 tokens long, which is
# the pipeline's prompt_template_encode_start_idx (where the prompt's embeddings begin).
_QWEN_SPLITS = {"Ġdynamism": ["Ġdynam", "ism"], "Ġscren": ["Ġscr", "en"],
                "Ġpostprocessing": ["Ġpost", "processing"]}


def _qwen_tokenizer(template: str, start_idx: int, splits: dict = _QWEN_SPLITS):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    split = Qwen2Tokenizer()._tokenizer.pre_tokenizer
    words = [w for part in re.split(r"<\|im_start\|>|<\|im_end\|>|\{\}", template + " a cat")
             for w, _ in split.pre_tokenize_str(part)]
    bpe = Tokenizer(models.BPE())
    bpe.train_from_iterator(
        [p for w in words for p in splits.get(w, [w])],
        trainers.BpeTrainer(vocab_size=10_000, show_progress=False, special_tokens=special,
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = json.loads(bpe.to_str())["model"]
    tokenizer = Qwen2Tokenizer(vocab=model["vocab"], merges=[tuple(m) for m in model["merges"]])
    tokenizer.add_special_tokens({"additional_special_tokens": special[1:]})
    prefix = tokenizer(template.split("{}")[0])["input_ids"]
    assert len(prefix) == start_idx, (len(prefix), start_idx)
    return tokenizer


def _clip_tokenizer():
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer

    chars = sorted(pre_tokenizers.ByteLevel.alphabet())  # no merges: one token per character
    tokens = chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"]
    return CLIPTokenizer(vocab={t: i for i, t in enumerate(tokens)}, merges=[])


def build_kandinsky5_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=32, width=32, num_frames=5,
    # num_inference_steps=2, guidance_scale=4.0, max_sequence_length=8, output_type="np")
    # gives 3 finite 16x16 frames (as in the diffusers test: the two-block test VAE decodes
    # fewer frames and pixels than its compression ratios say). The default negative prompt
    # is longer than max_sequence_length and is truncated, with a warning.
    from diffusers import Kandinsky5T2VPipeline

    return kandinsky5_pipeline(Kandinsky5T2VPipeline, vae_blocks=2, visual_cond=False)


def kandinsky5_pipeline(cls, vae_blocks: int, visual_cond: bool):
    """A tiny Kandinsky 5 pipeline of class ``cls``: text-to-video, or image-to-video
    (``visual_cond``, whose test VAE has three blocks)."""
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        Kandinsky5Transformer3DModel,
    )

    qwen_hidden_size, clip_hidden_size = 32, 16
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        vae = AutoencoderKLHunyuanVideo(
            act_fn="silu", block_out_channels=[32, 64, 64][:vae_blocks],
            down_block_types=["HunyuanVideoDownBlock3D"] * vae_blocks, in_channels=3,
            latent_channels=16, layers_per_block=1, mid_block_add_attention=False,
            norm_num_groups=32, out_channels=3, scaling_factor=0.476986,
            spatial_compression_ratio=8, temporal_compression_ratio=4,
            up_block_types=["HunyuanVideoUpBlock3D"] * vae_blocks)
        text_encoder, text_encoder_2 = text_encoders(qwen_hidden_size, clip_hidden_size)
        torch.manual_seed(0)
        transformer = Kandinsky5Transformer3DModel(
            in_visual_dim=16, in_text_dim=qwen_hidden_size, in_text_dim2=clip_hidden_size,
            time_dim=16, out_visual_dim=16, patch_size=(1, 2, 2), model_dim=16, ff_dim=32,
            num_text_blocks=1, num_visual_blocks=2, axes_dims=(1, 1, 2), visual_cond=visual_cond,
            attention_type="regular")
    for module in (transformer, vae, text_encoder, text_encoder_2):
        module.eval()
    pipe = cls(
        transformer=transformer, vae=vae, text_encoder=text_encoder, tokenizer=None,
        text_encoder_2=text_encoder_2, tokenizer_2=_clip_tokenizer(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))
    pipe.register_modules(tokenizer=_qwen_tokenizer(pipe.prompt_template,
                                                    pipe.prompt_template_encode_start_idx))
    return pipe


def text_encoders(qwen_hidden_size: int, clip_hidden_size: int):
    """The tiny Qwen2.5-VL and CLIP text encoders of the Kandinsky 5 and 6 tests, each
    made from seed 0."""
    from transformers import (
        CLIPTextConfig,
        CLIPTextModel,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
    )

    torch.manual_seed(0)
    text_encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
        text_config={
            "hidden_size": qwen_hidden_size, "intermediate_size": qwen_hidden_size,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
            "rope_scaling": {"mrope_section": [2, 2, 4], "rope_type": "default",
                             "type": "default"},
            "rope_theta": 1000000.0},
        vision_config={
            "depth": 2, "hidden_size": qwen_hidden_size,
            "intermediate_size": qwen_hidden_size, "num_heads": 2,
            "out_hidden_size": qwen_hidden_size},
        hidden_size=qwen_hidden_size, vocab_size=152064, vision_end_token_id=151653,
        vision_start_token_id=151652, vision_token_id=151654))
    torch.manual_seed(0)
    text_encoder_2 = CLIPTextModel(CLIPTextConfig(
        bos_token_id=0, eos_token_id=2, hidden_size=clip_hidden_size, intermediate_size=16,
        layer_norm_eps=1e-05, num_attention_heads=2, num_hidden_layers=2, pad_token_id=1,
        vocab_size=1000, projection_dim=clip_hidden_size))
    return text_encoder, text_encoder_2
