"""A tiny random Kandinsky 5 image-to-video pipeline (configs as in diffusers' own Kandinsky 5
I2V tests; the tokenizers are built in code as in models.kandinsky5)."""

import torch


def build_kandinsky5_i2v_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(image=<32x32 image>, prompt="a cat",
    # height=32, width=32, num_frames=17, num_inference_steps=2, guidance_scale=4.0,
    # max_sequence_length=8, output_type="np") gives 17 finite 32x32 frames (with
    # num_frames=5, 2 latent frames, it gives NaN frames in plain diffusers too).
    from diffusers import (AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler,
                           Kandinsky5I2VPipeline, Kandinsky5Transformer3DModel)
    from transformers import (CLIPTextConfig, CLIPTextModel, Qwen2_5_VLConfig,
                              Qwen2_5_VLForConditionalGeneration)

    from models.kandinsky5 import _clip_tokenizer, _qwen_tokenizer

    qwen_hidden_size, clip_hidden_size = 32, 16
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        vae = AutoencoderKLHunyuanVideo(
            act_fn="silu", block_out_channels=[32, 64, 64],
            down_block_types=["HunyuanVideoDownBlock3D"] * 3, in_channels=3, latent_channels=16,
            layers_per_block=1, mid_block_add_attention=False, norm_num_groups=32,
            out_channels=3, scaling_factor=0.476986, spatial_compression_ratio=8,
            temporal_compression_ratio=4, up_block_types=["HunyuanVideoUpBlock3D"] * 3)
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
        torch.manual_seed(0)
        transformer = Kandinsky5Transformer3DModel(
            in_visual_dim=16, in_text_dim=qwen_hidden_size, in_text_dim2=clip_hidden_size,
            time_dim=16, out_visual_dim=16, patch_size=(1, 2, 2), model_dim=16, ff_dim=32,
            num_text_blocks=1, num_visual_blocks=2, axes_dims=(1, 1, 2), visual_cond=True,
            attention_type="regular")
    for module in (transformer, vae, text_encoder, text_encoder_2):
        module.eval()
    pipe = Kandinsky5I2VPipeline(
        transformer=transformer, vae=vae, text_encoder=text_encoder, tokenizer=None,
        text_encoder_2=text_encoder_2, tokenizer_2=_clip_tokenizer(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))
    pipe.register_modules(tokenizer=_qwen_tokenizer(pipe.prompt_template,
                                                    pipe.prompt_template_encode_start_idx))
    return pipe
