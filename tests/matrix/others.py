"""CogVideoX video-to-video and Fun-Control, Cosmos, EasyAnimate, Motif-Video, Kandinsky 5
image-to-video and 6, Sana image-to-video and Sana-WM."""

from matrix.entries import IMAGE, MASK, VIDEO, AsTensor, Matches, Refused

ENTRIES = {
    "EasyAnimatePipeline": Matches(
        "easyanimate",
        {"height": 16, "width": 16, "frames": 5, "steps": 2, "guidance_scale": 6.0,
         "negative_prompt": ""},
        {"height": 16, "width": 16, "num_frames": 5, "num_inference_steps": 2,
         "guidance_scale": 6.0, "negative_prompt": ""},
        note="generate.negative_prompt must be set (an empty string will do): with "
             "classifier-free guidance the pipeline cannot encode a negative prompt of None"),
    "MotifVideoPipeline": Matches(
        "motif_video",
        {"height": 16, "width": 16, "frames": 9, "steps": 2, "max_sequence_length": 16},
        {"height": 16, "width": 16, "num_frames": 9, "num_inference_steps": 2,
         "max_sequence_length": 16},
        note="no generate.guidance_scale: guidance is the pipeline's guider component's "
             "(AdaptiveProjectedGuidance), set in its saved config"),
    "CosmosTextToWorldPipeline": Matches(
        "cosmos_text2world",
        {"height": 32, "width": 32, "frames": 9, "steps": 2, "guidance_scale": 3.0,
         "max_sequence_length": 16},
        {"height": 32, "width": 32, "num_frames": 9, "num_inference_steps": 2,
         "guidance_scale": 3.0, "max_sequence_length": 16},
        note="the checkpoint must hold a safety checker (the cosmos_guardrail package's, "
             "or here a pass-through stand-in): Cosmos pipelines refuse to run without one; "
             "the real transformers also need torchvision installed"),
    "Cosmos2_5_PredictBasePipeline": Matches(
        "cosmos2_5_predict",
        {"height": 32, "width": 32, "frames": 3, "steps": 2, "guidance_scale": 3.0,
         "max_sequence_length": 16},
        {"height": 32, "width": 32, "num_frames": 3, "num_inference_steps": 2,
         "guidance_scale": 3.0, "max_sequence_length": 16},
        note="text-to-world (no image, no video); the checkpoint must hold a safety "
             "checker, as for every Cosmos pipeline; image-to-world needs torchvision"),
    "Kandinsky6TI2VAPipeline": Matches(
        "kandinsky6",
        {"height": 16, "width": 16, "frames": 5, "steps": 2, "guidance_scale": 5.0,
         "max_sequence_length": 16},
        {"height": 16, "width": 16, "num_frames": 5, "num_inference_steps": 2,
         "guidance_scale": 5.0, "max_sequence_length": 16},
        note="text to video and sound (in the mp4, and audio.wav with output.wav)"),
    "CogVideoXVideoToVideoPipeline": Matches(
        "cogvideox_video2video",
        {"video": VIDEO, "height": 16, "width": 16, "steps": 2, "guidance_scale": 6.0,
         "max_sequence_length": 16, "extra": {"strength": 0.5}},
        {"video": VIDEO, "height": 16, "width": 16, "num_inference_steps": 2,
         "guidance_scale": 6.0, "max_sequence_length": 16, "strength": 0.5},
        input_size=(8, 16, 16),
        note="generate.video (the frames to transform; their count is the output's, so no "
             "generate.frames); extra.strength"),
    "CogVideoXFunControlPipeline": Matches(
        "cogvideox_fun_control",
        {"control_video": VIDEO, "height": 16, "width": 16, "steps": 2,
         "guidance_scale": 6.0, "max_sequence_length": 16},
        {"control_video": VIDEO, "height": 16, "width": 16, "num_inference_steps": 2,
         "guidance_scale": 6.0, "max_sequence_length": 16},
        input_size=(8, 16, 16),
        note="generate.control_video (its frame count is the output's: no generate.frames)"),
    "Kandinsky5I2VPipeline": Matches(
        "kandinsky5_i2v",
        {"image": IMAGE, "height": 32, "width": 32, "frames": 17, "steps": 2,
         "guidance_scale": 4.0, "max_sequence_length": 8},
        {"image": IMAGE, "height": 32, "width": 32, "num_frames": 17, "num_inference_steps": 2,
         "guidance_scale": 4.0, "max_sequence_length": 8},
        input_size=(1, 32, 32),
        note="generate.image (the first frame)"),
    "SanaImageToVideoPipeline": Matches(
        "sana_video_i2v",
        {"image": IMAGE, "height": 32, "width": 32, "frames": 9, "steps": 2,
         "guidance_scale": 6.0, "max_sequence_length": 16,
         "extra": {"complex_human_instruction": [], "use_resolution_binning": False}},
        {"image": IMAGE, "height": 32, "width": 32, "frames": 9, "num_inference_steps": 2,
         "guidance_scale": 6.0, "max_sequence_length": 16, "complex_human_instruction": [],
         "use_resolution_binning": False},
        input_size=(1, 32, 32),
        note="generate.image (the first frame); extra.complex_human_instruction: [] and "
             "extra.use_resolution_binning: false, as for the tiny SanaVideoPipeline (its "
             "default instruction overflows a tiny text length; binning resizes to the "
             "model's resolutions)"),
    "MotifVideoImage2VideoPipeline": Matches(
        "motif_video_i2v",
        {"image": IMAGE, "height": 16, "width": 16, "frames": 9, "steps": 2,
         "max_sequence_length": 16},
        {"image": IMAGE, "height": 16, "width": 16, "num_frames": 9, "num_inference_steps": 2,
         "max_sequence_length": 16},
        note="generate.image (the first frame); no generate.guidance_scale, as for "
             "MotifVideoPipeline (the guider component guides)"),
    "CosmosVideoToWorldPipeline": Matches(
        "cosmos_video2world",
        {"image": IMAGE, "height": 32, "width": 32, "frames": 9, "steps": 2,
         "guidance_scale": 3.0, "max_sequence_length": 16},
        {"image": IMAGE, "height": 32, "width": 32, "num_frames": 9, "num_inference_steps": 2,
         "guidance_scale": 3.0, "max_sequence_length": 16},
        input_size=(1, 32, 32),
        note="generate.image (the first frame; generate.video gives conditioning frames "
             "instead); the checkpoint must hold a safety checker, as for every Cosmos "
             "pipeline"),
    "Cosmos2VideoToWorldPipeline": Matches(
        "cosmos2_video2world",
        {"image": IMAGE, "height": 32, "width": 32, "frames": 9, "steps": 2,
         "guidance_scale": 3.0, "max_sequence_length": 16},
        {"image": IMAGE, "height": 32, "width": 32, "num_frames": 9, "num_inference_steps": 2,
         "guidance_scale": 3.0, "max_sequence_length": 16},
        input_size=(1, 32, 32),
        note="generate.image (the first frame; generate.video gives conditioning frames "
             "instead); the checkpoint must hold a safety checker, as for every Cosmos "
             "pipeline"),
}

ENTRIES.update({
    "SanaWMPipeline": Matches(
            "sana_wm",
            {"image": IMAGE, "height": 32, "width": 32, "frames": 9, "steps": 2,
             "max_sequence_length": 8,
             "extra": {"action": "w-8", "intrinsics": [16.0, 16.0, 16.0, 16.0], "chi_prompt": []}},
            {"image": IMAGE, "height": 32, "width": 32, "num_frames": 9, "num_inference_steps": 2,
             "max_sequence_length": 8, "action": "w-8", "intrinsics": [16.0, 16.0, 16.0, 16.0],
             "chi_prompt": []},
            input_size=(1, 32, 32),
            note="generate.image (the first frame); the camera path as extra.action (a WASD/IJKL "
                 "string) and extra.intrinsics ([fx, fy, cx, cy] of the image); "
                 "extra.chi_prompt: [] keeps the tiny test's prompt short"),
    "Cosmos2_5_TransferPipeline": Refused("its controls (a dict of control videos) have no recipe key"),
    "EasyAnimateControlPipeline": Refused("fails in diffusers 0.42 itself"),
    "EasyAnimateInpaintPipeline": Matches(
        "easyanimate_inpaint",
        {"video": VIDEO, "mask": MASK, "height": 16, "width": 16, "frames": 5, "steps": 2,
         "guidance_scale": 6.0, "negative_prompt": ""},
        {"video": AsTensor(VIDEO), "mask_video": AsTensor(MASK, channels=1, divisor=1.0),
         "height": 16, "width": 16, "num_frames": 5, "num_inference_steps": 2,
         "guidance_scale": 6.0, "negative_prompt": ""},
        input_size=(5, 16, 16),
        note="generate.video and generate.mask (it takes tensors only: Porter gives them as "
             "1 x C x F x H x W, the video in [0, 1], the mask in 0 and 255 as its own helper "
             "does); generate.negative_prompt, as for EasyAnimatePipeline"),
    # nn.Module.buffers() of a compiled module: Porter's Buffers (transforms/jit.py)
    "Cosmos3OmniPipeline": Matches(
        "cosmos3_omni",
        {"height": 16, "width": 16, "frames": 5, "steps": 2, "guidance_scale": 1.0,
         "extra": {"use_system_prompt": False}},
        {"height": 16, "width": 16, "num_frames": 5, "num_inference_steps": 2,
         "guidance_scale": 1.0, "use_system_prompt": False},
        note="extra.use_system_prompt: false keeps the tiny test's prompt short; the "
             "frames are the output's video (Porter reads frames, video or images)"),
})

#: none: every class's inputs are images, videos, masks or plain YAML values
