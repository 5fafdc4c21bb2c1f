"""A tiny random Wan-Animate-2 modular pipeline (WanAnimate2ModularPipeline: a character image
animated by a driving video, segment by segment, modular only). The transformer takes the
config of diffusers' own Wan-Animate-2 transformer test (which mirrors diffusers' tiny modular
checkpoint); the VAE is the Wan VAE of diffusers' Wan tests (models.wan_parts); the UMT5 text
encoder takes the config of the hub's tiny-random-t5 (as models.wan_parts, 32 wide: the
transformer's text_dim), with a ByT5 tokenizer. The CLIP vision encoder has to be 1280 wide
(the transformer's image projection hardcodes CLIP's hidden size) and sees 224x224 (the blocks
resize to it), so it is one layer of 2 heads over 32 pixel patches. The scheduler is the class
the released base checkpoint ships (DPMSolverMultistepScheduler, flow prediction, flow shift
5.0); the guider is the blocks' default (classifier-free guidance at 3.0). Saved as a modular
checkpoint."""

import torch

#: the transformer's text length, which the call's max_sequence_length matches
TEXT_LEN = 16


def wan_animate2_components():
    """transformer, vae, text encoder, tokenizer and image encoder, each in eval mode."""
    from diffusers import WanAnimate2Transformer3DModel
    from transformers import (
        ByT5Tokenizer,
        CLIPVisionConfig,
        CLIPVisionModel,
        UMT5Config,
        UMT5EncoderModel,
    )

    from models.wan_parts import evaluated, wan_vae

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = WanAnimate2Transformer3DModel(
            patch_size=(1, 2, 2), text_len=TEXT_LEN, in_dim=36, dim=128, ffn_dim=256,
            freq_dim=64, text_dim=32, out_dim=16, num_heads=4, num_layers=2,
            cross_attn_norm=True, use_img_emb=True)
        torch.manual_seed(0)
        vae = wan_vae()
        torch.manual_seed(0)
        text_encoder = UMT5EncoderModel(UMT5Config(
            vocab_size=1103, d_model=32, d_kv=8, d_ff=37, num_layers=5, num_heads=4,
            relative_attention_num_buckets=8, initializer_factor=0.002))
        torch.manual_seed(0)
        image_encoder = CLIPVisionModel(CLIPVisionConfig(
            hidden_size=1280, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
            image_size=224, patch_size=32))
    evaluated(transformer, vae, text_encoder, image_encoder)
    return {"transformer": transformer, "vae": vae, "text_encoder": text_encoder,
            "tokenizer": ByT5Tokenizer(), "image_encoder": image_encoder}


def build_wan_animate2_pipeline():
    from diffusers import DPMSolverMultistepScheduler, WanAnimate2ModularPipeline

    pipe = WanAnimate2ModularPipeline()
    pipe.update_components(
        **wan_animate2_components(),
        scheduler=DPMSolverMultistepScheduler(
            prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0))
    return pipe
