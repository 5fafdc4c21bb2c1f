"""A tiny random AnimateDiff text-to-video pipeline (configs as in diffusers' own AnimateDiff
tests), and the pieces the other tiny UNet video pipelines share: a CLIP text encoder built
from its config and a CLIPTokenizer built in code (in place of hub's tiny-random-clip)."""

import torch


def clip_tokenizer():
    """A byte-level CLIPTokenizer with no merges (one token per character; 514 tokens, under
    the tiny text encoders' vocab_size of 1000; prompts padded to 77 as in tiny-random-clip),
    built in code."""
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer

    chars = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"]
    return CLIPTokenizer(vocab={t: i for i, t in enumerate(tokens)}, merges=[],
                         model_max_length=77)


def clip_text_encoder(hidden_size=32, intermediate_size=37, heads=4, layers=5, **extra):
    """The diffusers tests' tiny CLIPTextModel (seed it first)."""
    from transformers import CLIPTextConfig, CLIPTextModel

    return CLIPTextModel(CLIPTextConfig(
        bos_token_id=0, eos_token_id=2, hidden_size=hidden_size,
        intermediate_size=intermediate_size, layer_norm_eps=1e-05,
        num_attention_heads=heads, num_hidden_layers=layers, pad_token_id=1,
        vocab_size=1000, **extra))


def animatediff_components(small=False, controlnet=None):
    """unet, vae, text_encoder, tokenizer, motion_adapter and scheduler of the AnimateDiff
    tests (SD 1.5-like: a 2D UNet, a 2-block VAE, a motion adapter for the UNet's blocks).
    ``small``: the (8, 8)-channel variant of the PAG, ControlNet and video-to-video
    ControlNet tests; ``controlnet``: "controlnet" (a ControlNetModel) or "sparse" (a
    SparseControlNetModel) as in those tests."""
    from diffusers import (
        AutoencoderKL,
        ControlNetModel,
        DDIMScheduler,
        MotionAdapter,
        SparseControlNetModel,
        UNet2DConditionModel,
    )

    channels, cross = ((8, 8), 8) if small else ((32, 64), 32)
    found = {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        unet = UNet2DConditionModel(
            block_out_channels=channels, layers_per_block=2, sample_size=8 if small else 32,
            in_channels=4, out_channels=4,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=cross,
            norm_num_groups=2)
        scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012,
                                  beta_schedule="linear", clip_sample=False)
        if controlnet == "controlnet":
            torch.manual_seed(0)
            found["controlnet"] = ControlNetModel(
                block_out_channels=channels, layers_per_block=2, in_channels=4,
                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                cross_attention_dim=cross, conditioning_embedding_out_channels=(8, 8),
                norm_num_groups=1)
        elif controlnet == "sparse":
            torch.manual_seed(0)
            found["controlnet"] = SparseControlNetModel(
                block_out_channels=channels, layers_per_block=2, in_channels=4,
                conditioning_channels=3,
                down_block_types=("CrossAttnDownBlockMotion", "DownBlockMotion"),
                cross_attention_dim=cross, conditioning_embedding_out_channels=(8, 8),
                norm_num_groups=1, use_simplified_condition_embedding=False)
        torch.manual_seed(0)
        vae = AutoencoderKL(
            block_out_channels=list(channels), in_channels=3, out_channels=3,
            down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
            up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"], latent_channels=4,
            **({"norm_num_groups": 2} if small else {}))
        torch.manual_seed(0)
        text_encoder = clip_text_encoder(hidden_size=cross)
        torch.manual_seed(0)
        motion_adapter = MotionAdapter(
            block_out_channels=channels, motion_layers_per_block=2, motion_norm_num_groups=2,
            motion_num_attention_heads=4)
    found.update(unet=unet, scheduler=scheduler, vae=vae, motion_adapter=motion_adapter,
                 text_encoder=text_encoder, tokenizer=clip_tokenizer(),
                 feature_extractor=None, image_encoder=None)
    for module in found.values():
        if isinstance(module, torch.nn.Module):
            module.eval()
    return found


def animatediff_pipeline(cls, **components):
    """``cls`` built from ``components``, its UNetMotionModel (which the pipeline builds
    from unet and motion_adapter) in eval mode."""
    pipe = cls(**components)
    pipe.unet.eval()
    return pipe


def build_animatediff_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe("a cat", height=16, width=16,
    # num_frames=2, num_inference_steps=2, guidance_scale=7.5, output_type="np") gives
    # 2 finite 16x16 frames.
    from diffusers import AnimateDiffPipeline

    return animatediff_pipeline(AnimateDiffPipeline, **animatediff_components())
