"""LTX-Video, LTX-2 and HunyuanVideo variants."""

from matrix.entries import IMAGE, Matches, Refused

#: the tiny Llava's prompt template (as in diffusers' tests): no chat markup, its 49 image
#: tokens (a 224-pixel CLIP image in 32-pixel patches) at 5..54
HUNYUAN_I2V_TEMPLATE = {"template": "{}", "crop_start": 0, "image_emb_len": 49,
                        "image_emb_start": 5, "image_emb_end": 54}

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
        note="video and audio; Porter keeps the video frames (output.frames)"),
    "LTX2ImageToVideoPipeline": Matches(
        "ltx2_image_to_video",
        {"image": IMAGE, "height": 32, "width": 32, "frames": 5, "steps": 2,
         "max_sequence_length": 16, "extra": {"frame_rate": 25.0}},
        {"image": IMAGE, "height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 2,
         "max_sequence_length": 16, "frame_rate": 25.0},
        input_size=(9, 32, 32),
        note="generate.image is the first frame; video and audio, Porter keeps the video "
             "frames (output.frames)"),
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
    "LTXI2VLongMultiPromptPipeline": Refused("its step callback writes the unpacked "
                                             "latents over the packed ones"),
    "LTX2VideoDiffusionDecodePipeline": Refused("needs latents, which no recipe gives"),
    "LTX2DFRTemporalRefinePipeline": Refused("refines another run's latents"),
    "LTX2LatentUpsamplePipeline": Refused(
        "takes no num_inference_steps argument",
        note=": it upsamples another run's video or latents; it does not denoise"),
    "LTX2ConditionPipeline": Refused("LTX2VideoCondition objects"),
    "LTX2HDRPipeline": Refused("reference_conditions are condition objects"),
    "LTX2InContextPipeline": Refused("conditions and reference_conditions are condition "
                                     "objects"),
    "LTX2DFRPipeline": Refused("video_tiles and keyframe latents have no recipe key"),
})
