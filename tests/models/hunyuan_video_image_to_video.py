"""A tiny random HunyuanVideo image-to-video pipeline (configs as in diffusers' own
HunyuanVideo image-to-video tests). The hub tokenizers are replaced by ByT5 tokenizers built
in code (as porter_hunyuan's tiny.py does); the Llava text encoder's pad token is ByT5's (0)
and its image token 101 a byte no test prompt holds ("b")."""

import torch


def build_hunyuan_video_image_to_video_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(image, "a cat", height=16, width=16,
    # num_frames=9, num_inference_steps=2, guidance_scale=4.5, max_sequence_length=64,
    # prompt_template={"template": "{}", "crop_start": 0, "image_emb_len": 49,
    # "image_emb_start": 5, "image_emb_end": 54}, output_type="np") gives 5 finite 16x16
    # frames (the pipeline drops the first latent frame's 4 frames).
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideoImageToVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )
    from transformers import (
        ByT5Tokenizer,
        CLIPImageProcessor,
        CLIPTextConfig,
        CLIPTextModel,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    from models.hunyuan_skyreels_image_to_video import tiny_vae

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = HunyuanVideoTransformer3DModel(
            in_channels=2 * 4 + 1, out_channels=4, num_attention_heads=2, attention_head_dim=10,
            num_layers=1, num_single_layers=1, num_refiner_layers=1, patch_size=1,
            patch_size_t=1, guidance_embeds=False, text_embed_dim=16, pooled_projection_dim=8,
            rope_axes_dim=(2, 4, 4), image_condition_type="latent_concat")
        vae = tiny_vae()
        text_config = LlamaConfig(
            bos_token_id=0, eos_token_id=2, hidden_size=16, intermediate_size=37,
            layer_norm_eps=1e-05, num_attention_heads=4, num_hidden_layers=2, pad_token_id=0,
            vocab_size=1000, hidden_act="gelu")
        vision_config = CLIPVisionConfig(
            hidden_size=8, intermediate_size=37, projection_dim=32, num_attention_heads=4,
            num_hidden_layers=2, image_size=224)
        torch.manual_seed(0)
        text_encoder = LlavaForConditionalGeneration(LlavaConfig(
            vision_config=vision_config, text_config=text_config, pad_token_id=0,
            image_token_index=101))
        torch.manual_seed(0)
        text_encoder_2 = CLIPTextModel(CLIPTextConfig(
            bos_token_id=0, eos_token_id=2, hidden_size=8, intermediate_size=37,
            layer_norm_eps=1e-05, num_attention_heads=4, num_hidden_layers=2, pad_token_id=1,
            vocab_size=1000, hidden_act="gelu", projection_dim=32))
    for module in (transformer, vae, text_encoder, text_encoder_2):
        module.eval()
    image_processor = CLIPImageProcessor(
        crop_size=224, do_center_crop=True, do_normalize=True, do_resize=True,
        image_mean=[0.48145466, 0.4578275, 0.40821073],
        image_std=[0.26862954, 0.26130258, 0.27577711], resample=3, size=224)
    return HunyuanVideoImageToVideoPipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder=text_encoder, text_encoder_2=text_encoder_2, tokenizer=ByT5Tokenizer(),
        tokenizer_2=ByT5Tokenizer(), image_processor=image_processor)
