"""A tiny random HunyuanVideo pipeline (shapes as in diffusers' own tests), with
byte-level tokenizers in place of Llama's and CLIP's, so no files are needed."""

from __future__ import annotations

from porter.shims import lazy

torch = lazy.module("torch", __name__)


def build_pipeline(seed: int = 0):
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )
    from transformers import (
        ByT5Tokenizer,
        CLIPTextConfig,
        CLIPTextModel,
        LlamaConfig,
        LlamaModel,
    )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = HunyuanVideoTransformer3DModel(
            in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10,
            num_layers=1, num_single_layers=1, num_refiner_layers=1, patch_size=1,
            patch_size_t=1, guidance_embeds=True, text_embed_dim=16, pooled_projection_dim=8,
            rope_axes_dim=(2, 4, 4))
        vae = AutoencoderKLHunyuanVideo(**VAE)
        text_encoder = LlamaModel(LlamaConfig(
            bos_token_id=0, eos_token_id=2, hidden_size=16, intermediate_size=37,
            max_position_embeddings=512, num_attention_heads=4, num_hidden_layers=2,
            pad_token_id=1, vocab_size=1000, hidden_act="gelu"))
        text_encoder_2 = CLIPTextModel(CLIPTextConfig(
            bos_token_id=0, eos_token_id=2, hidden_size=8, intermediate_size=37,
            num_attention_heads=4, num_hidden_layers=2, pad_token_id=1, vocab_size=1000,
            hidden_act="gelu", projection_dim=32))
    return _in_eval(HunyuanVideoPipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder=text_encoder, tokenizer=ByT5Tokenizer(), text_encoder_2=text_encoder_2,
        tokenizer_2=ByT5Tokenizer()))


def _in_eval(pipe):
    """``pipe`` as ``from_pretrained`` gives it, every module in eval mode: a module
    built from its configuration starts in training mode, and a dropout (1.5's T5
    glyph encoder has one) would make two calls of the same pipeline differ."""
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            component.eval()
    return pipe


# A chat template for the byte-level tokenizer: HunyuanVideo 1.5 wraps prompts
# in a chat (system + user) before its Qwen2.5-VL text encoder.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    "{% endfor %}")


#: the tiny HunyuanVideo VAE's configuration (the family reads its compression)
VAE = dict(in_channels=3, out_channels=3, latent_channels=4,
           down_block_types=("HunyuanVideoDownBlock3D",) * 4,
           up_block_types=("HunyuanVideoUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8),
           layers_per_block=1, act_fn="silu", norm_num_groups=4, scaling_factor=0.476986,
           spatial_compression_ratio=8, temporal_compression_ratio=4,
           mid_block_add_attention=True)
#: the tiny 1.5 VAE (compresses time 2x and space 4x; the real one 4x and 16x)
VAE_15 = dict(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(16, 16),
              layers_per_block=1, spatial_compression_ratio=4, temporal_compression_ratio=2,
              downsample_match_channel=False, upsample_match_channel=False)


def build_pipeline_15(seed: int = 0, guidance_scale: float = 6.0):
    """A tiny HunyuanVideo 1.5 (shapes as in diffusers' own tests): Qwen2.5-VL text
    encoder, ByT5 glyph encoder, classifier-free guider."""
    from diffusers import (
        AutoencoderKLHunyuanVideo15,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Pipeline,
        HunyuanVideo15Transformer3DModel,
    )
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import (
        ByT5Tokenizer,
        Qwen2_5_VLTextConfig,
        Qwen2_5_VLTextModel,
        T5Config,
        T5EncoderModel,
    )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = HunyuanVideo15Transformer3DModel(
            in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=8,
            num_layers=1, num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1,
            text_embed_dim=16, text_embed_2_dim=32, image_embed_dim=12,
            rope_axes_dim=(2, 2, 4), target_size=16, task_type="t2v")
        vae = AutoencoderKLHunyuanVideo15(**VAE_15)
        text_encoder = Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(
            hidden_size=16, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=2, vocab_size=384, bos_token_id=None, eos_token_id=None,
            rope_scaling={"mrope_section": [1, 1, 2], "rope_type": "default",
                          "type": "default"}, rope_theta=1000000.0))
        text_encoder_2 = T5EncoderModel(T5Config(
            vocab_size=384, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
            relative_attention_num_buckets=8))
    tokenizer = ByT5Tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    return _in_eval(HunyuanVideo15Pipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder=text_encoder, tokenizer=tokenizer, text_encoder_2=text_encoder_2,
        tokenizer_2=ByT5Tokenizer(),
        guider=ClassifierFreeGuidance(guidance_scale=guidance_scale)))
