"""LTX-Video, LTX-2 and HunyuanVideo variants."""

from matrix.entries import IMAGE, LATENTS, Conditions, Matches, Refused

#: the tiny Llava's prompt template (as in diffusers' tests): no chat markup, its 49 image
#: tokens (a 224-pixel CLIP image in 32-pixel patches) at 5..54
HUNYUAN_I2V_TEMPLATE = {"template": "{}", "crop_start": 0, "image_emb_len": 49,
                        "image_emb_start": 5, "image_emb_end": 54}

#: the tiny LTX-2 settings of diffusers' tests (guidance 1: no classifier-free pass)
LTX2_T2V = {"height": 32, "width": 32, "frames": 5, "steps": 2, "guidance_scale": 1.0,
            "negative_prompt": "", "max_sequence_length": 16, "extra": {"frame_rate": 25.0}}
LTX2_CALL = {"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 2,
             "guidance_scale": 1.0, "negative_prompt": "", "max_sequence_length": 16,
             "frame_rate": 25.0}
#: an image conditioning frame 0 (crf 0: no H.264 re-compression)
FRAME_0 = {"frames": IMAGE, "index": 0, "strength": 1.0, "crf": 0}
VIDEO_CONDITION = "diffusers.pipelines.ltx2.pipeline_ltx2_condition:LTX2VideoCondition"

ENTRIES = {
    "LTXPipeline": Matches(
        "ltx", {"height": 32, "width": 32, "frames": 9, "steps": 2, "guidance_scale": 3.0,
                "max_sequence_length": 16},
        {"height": 32, "width": 32, "num_frames": 9, "num_inference_steps": 2,
         "guidance_scale": 3.0, "max_sequence_length": 16},
        note="max_sequence_length: 16 keeps the tiny T5 prompt short"),
    "LTXImageToVideoPipeline": Matches(
        "ltx_image_to_video",
        {"image": IMAGE, "height": 32, "width": 32, "frames": 9, "steps": 2,
         "guidance_scale": 3.0, "max_sequence_length": 16},
        {"image": IMAGE, "height": 32, "width": 32, "num_frames": 9, "num_inference_steps": 2,
         "guidance_scale": 3.0, "max_sequence_length": 16},
        input_size=(9, 32, 32), note="generate.image is the first frame"),
    "LTXConditionPipeline": Matches(
        "ltx_condition",
        {"image": IMAGE, "height": 32, "width": 32, "frames": 9, "steps": 2,
         "guidance_scale": 3.0, "max_sequence_length": 16},
        {"image": IMAGE, "height": 32, "width": 32, "num_frames": 9, "num_inference_steps": 2,
         "guidance_scale": 3.0, "max_sequence_length": 16},
        input_size=(9, 32, 32),
        note="generate.image conditions frame 0 (the pipeline's image argument); its "
             "conditions list of LTXVideoCondition objects has no recipe form"),
    "HunyuanSkyreelsImageToVideoPipeline": Matches(
        "hunyuan_skyreels_image_to_video",
        {"image": IMAGE, "height": 16, "width": 16, "frames": 9, "steps": 2,
         "guidance_scale": 4.5, "max_sequence_length": 16,
         "extra": {"prompt_template": {"template": "{}", "crop_start": 0}}},
        {"image": IMAGE, "height": 16, "width": 16, "num_frames": 9, "num_inference_steps": 2,
         "guidance_scale": 4.5, "max_sequence_length": 16,
         "prompt_template": {"template": "{}", "crop_start": 0}},
        note="extra.prompt_template only because the tiny tokenizer has no chat markup (the "
             "real model keeps the default); true_cfg_scale (default 6) is its "
             "classifier-free guidance, guidance_scale the embedded guidance"),
    "HunyuanVideoImageToVideoPipeline": Matches(
        "hunyuan_video_image_to_video",
        {"image": IMAGE, "height": 16, "width": 16, "frames": 9, "steps": 2,
         "guidance_scale": 4.5, "max_sequence_length": 64,
         "extra": {"prompt_template": HUNYUAN_I2V_TEMPLATE}},
        {"image": IMAGE, "height": 16, "width": 16, "num_frames": 9, "num_inference_steps": 2,
         "guidance_scale": 4.5, "max_sequence_length": 64,
         "prompt_template": HUNYUAN_I2V_TEMPLATE},
        note="extra.prompt_template (a mapping) only because the tiny text encoder's "
             "tokenizer and image tokens differ from the real model's; the real model "
             "keeps the pipeline's default template"),
    "LTX2Pipeline": Matches(
        "ltx2", {"height": 32, "width": 32, "frames": 5, "steps": 2,
                 "max_sequence_length": 16, "extra": {"frame_rate": 25.0}},
        {"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 2,
         "max_sequence_length": 16, "frame_rate": 25.0},
        note="video and sound (in the mp4)"),
    "LTX2ImageToVideoPipeline": Matches(
        "ltx2_image_to_video",
        {"image": IMAGE, "height": 32, "width": 32, "frames": 5, "steps": 2,
         "max_sequence_length": 16, "extra": {"frame_rate": 25.0}},
        {"image": IMAGE, "height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 2,
         "max_sequence_length": 16, "frame_rate": 25.0},
        input_size=(9, 32, 32),
        note="generate.image is the first frame; video and sound (in the mp4)"),
    "HunyuanVideoFramepackPipeline": Matches(
        "hunyuan_video_framepack",
        {"image": IMAGE, "height": 32, "width": 32, "frames": 9, "steps": 2,
         "guidance_scale": 4.5, "max_sequence_length": 64,
         "extra": {"latent_window_size": 3,
                   "prompt_template": {"template": "{}", "crop_start": 0}}},
        {"image": IMAGE, "height": 32, "width": 32, "num_frames": 9, "num_inference_steps": 2,
         "guidance_scale": 4.5, "max_sequence_length": 64, "latent_window_size": 3,
         "prompt_template": {"template": "{}", "crop_start": 0}},
        input_size=(9, 32, 32),
        note="generate.image is the first frame (generate.last_image the optional last); "
             "extra.latent_window_size: 3 only to keep the tiny run short, "
             "extra.prompt_template only because the tiny tokenizer has no chat markup; "
             "guidance_scale is the embedded guidance (true_cfg_scale, default 1, the "
             "classifier-free one)"),
    "HunyuanVideo15ImageToVideoPipeline": Matches(
        "hunyuan_video15_image_to_video",
        {"image": IMAGE, "frames": 9, "steps": 2},
        {"image": IMAGE, "num_frames": 9, "num_inference_steps": 2},
        note="generate.image is the first frame; no height, width or guidance_scale: the "
             "pipeline takes none (the image's size, fitted to the transformer's "
             "target_size, sets the video's; the guider component holds the guidance "
             "scale)"),
}

ENTRIES.update({
    # diffusers' own step callback is broken here: Porter runs it unwatched (UNWATCHED)
    "LTXI2VLongMultiPromptPipeline": Matches(
        "ltx_i2v_long_multi_prompt",
        {"height": 32, "width": 32, "frames": 9, "steps": 2, "max_sequence_length": 16,
         "extra": {"seed": None}},
        {"height": 32, "width": 32, "num_frames": 9, "num_inference_steps": 2,
         "max_sequence_length": 16, "seed": None},
        note="extra.seed: null (its own seed argument, default 0, makes a torch.Generator "
             "on the pipeline's device for each window, which JAX's device cannot hold; "
             "null uses generate.seed's generator throughout); prompts split by '|' make "
             "the segments; its first-frame argument is cond_image (extra.cond_image takes "
             "no file). Run without Porter's per-step NaN watch: its step callback writes "
             "the unpacked latents over the packed ones, a diffusers bug any callback "
             "triggers"),
    # flex attention: Porter's (porter/transforms/attention/flex.py)
    "LTX2VideoDiffusionDecodePipeline": Matches(
        "ltx2_diffusion_decode", {"prompt": None, "latents": LATENTS},
        {"prompt": None, "latents": LATENTS},
        note="generate.latents: another run's final latents (its latents.safetensors); no "
             "prompt and no steps (the decoder's own); its neighbourhood attention is flex "
             "attention, block by block where large (core.flex_attention)"),
    "LTX2DFRTemporalRefinePipeline": Refused("refines a DFR pass's latents"),
    "LTX2LatentUpsamplePipeline": Matches(
        "ltx2_latent_upsample", {"prompt": None, "latents": LATENTS},
        {"prompt": None, "latents": LATENTS}, latents_shape=(1, 4, 2, 4, 4),
        note="generate.latents: the latents to upsample (a safetensors file with a tensor "
             "named latents, as a run's latents.safetensors; here 5-D, batch x channels x "
             "frames x height x width), or generate.video; no prompt and no steps: it does "
             "not denoise"),
    "LTX2ConditionPipeline": Matches(
        "ltx2_condition", {**LTX2_T2V, "conditions": [FRAME_0]},
        {**LTX2_CALL, "conditions": Conditions(VIDEO_CONDITION, [FRAME_0])},
        input_size=(1, 32, 32),
        note="generate.conditions: a list of LTX2VideoCondition fields (frames: an image "
             "or a video, index: the frame it goes at, strength; crf: 0 skips the H.264 "
             "re-compression of an image)"),
    "LTX2HDRPipeline": Matches(
        "ltx2_hdr", {**LTX2_T2V, "reference_conditions": [{"frames": IMAGE}]},
        {**LTX2_CALL, "reference_conditions": Conditions(
            "diffusers.pipelines.ltx2.pipeline_ltx2_hdr_lora:LTX2HDRReferenceCondition",
            [{"frames": IMAGE}])},
        input_size=(1, 32, 32),
        note="generate.reference_conditions: a list of LTX2HDRReferenceCondition fields "
             "(frames, strength)"),
    "LTX2InContextPipeline": Matches(
        "ltx2_in_context", {**LTX2_T2V, "conditions": [FRAME_0]},
        {**LTX2_CALL, "conditions": Conditions(VIDEO_CONDITION, [FRAME_0])},
        input_size=(1, 32, 32),
        note="generate.conditions (as for LTX2ConditionPipeline) and "
             "generate.reference_conditions (LTX2ReferenceCondition fields: frames, "
             "strength)"),
    "LTX2DFRPipeline": Matches(
        "ltx2_dfr",
        {"height": 32, "width": 32, "frames": 9, "max_sequence_length": 16,
         "sigmas": [1.0, 0.5], "extra": {"frame_rate": 25.0}},
        {"height": 32, "width": 32, "num_frames": 9, "max_sequence_length": 16,
         "frame_rate": 25.0, "sigmas": [1.0, 0.5]},
        note="from a prompt (generate.conditions for frames; its video tiles and keyframe "
             "latents, another run's, have no recipe form); no generate.steps: the "
             "schedule is generate.sigmas (default 8 values)"),
})
