"""The UNet video pipelines: AnimateDiff (and its PAG, SDXL, ControlNet, SparseControlNet
and video-to-video variants), ModelScope text/video-to-video, Text2Video-Zero, I2VGen-XL,
PIA and Stable Video Diffusion. Porter's generic family compiles a ``transformer`` and the
VAE's decode; a ``unet`` runs through torchax op by op."""

from matrix.entries import IMAGE, VIDEO, Matches

#: the basics every entry here sets: 16x16 frames, 2 steps
BASE = {"height": 16, "width": 16, "steps": 2}
CALL = {"height": 16, "width": 16, "num_inference_steps": 2}

ENTRIES = {
    "AnimateDiffPipeline": Matches(
        "animatediff", {"height": 16, "width": 16, "frames": 2, "steps": 2,
                        "guidance_scale": 7.5},
        {"height": 16, "width": 16, "num_frames": 2, "num_inference_steps": 2,
         "guidance_scale": 7.5},
        note="nothing beyond the basics; the UNet (a UNetMotionModel) runs op by op"),
    "TextToVideoSDPipeline": Matches(
        "text_to_video_sd", {"height": 16, "width": 16, "frames": 2, "steps": 2,
                             "guidance_scale": 6.0},
        {"height": 16, "width": 16, "num_frames": 2, "num_inference_steps": 2,
         "guidance_scale": 6.0},
        note="nothing beyond the basics; the UNet (a UNet3DConditionModel) runs op by op"),
    "AnimateDiffPAGPipeline": Matches(
        "animatediff_pag", {**BASE, "frames": 2, "guidance_scale": 7.5,
                            "extra": {"pag_scale": 3.0}},
        {**CALL, "num_frames": 2, "guidance_scale": 7.5, "pag_scale": 3.0},
        note="extra.pag_scale: the perturbed-attention guidance scale (0 turns PAG off)"),
    "AnimateDiffControlNetPipeline": Matches(
        "animatediff_controlnet", {**BASE, "frames": 2, "guidance_scale": 7.5,
                                   "control_video": VIDEO},
        {**CALL, "num_frames": 2, "guidance_scale": 7.5, "conditioning_frames": VIDEO},
        input_size=(2, 16, 16),
        note="control_video: the ControlNet's conditioning frames (conditioning_frames), "
             "one per frame made"),
    "AnimateDiffSparseControlNetPipeline": Matches(
        "animatediff_sparse_controlnet", {**BASE, "frames": 2, "guidance_scale": 7.5,
                                          "control_video": VIDEO,
                                          "extra": {"controlnet_frame_indices": [0]}},
        {**CALL, "num_frames": 2, "guidance_scale": 7.5, "conditioning_frames": VIDEO,
         "controlnet_frame_indices": [0]},
        input_size=(1, 16, 16),
        note="control_video: the sparse conditioning frames (conditioning_frames); "
             "extra.controlnet_frame_indices: the frame each of them conditions"),
    "AnimateDiffVideoToVideoPipeline": Matches(
        "animatediff_video_to_video", {**BASE, "guidance_scale": 7.5, "video": VIDEO},
        {**CALL, "guidance_scale": 7.5, "video": VIDEO},
        input_size=(2, 16, 16),
        note="video: the input video; no frames (the video's length is the output's)"),
    "AnimateDiffVideoToVideoControlNetPipeline": Matches(
        "animatediff_video_to_video_controlnet",
        {**BASE, "guidance_scale": 7.5, "video": VIDEO, "control_video": VIDEO},
        {**CALL, "guidance_scale": 7.5, "video": VIDEO, "conditioning_frames": VIDEO},
        input_size=(2, 16, 16),
        note="video: the input video; control_video: the ControlNet's conditioning "
             "frames (conditioning_frames), one per input frame; no frames"),
    "AnimateDiffSDXLPipeline": Matches(
        "animatediff_sdxl", {**BASE, "frames": 2, "guidance_scale": 7.5},
        {**CALL, "num_frames": 2, "guidance_scale": 7.5},
        note="nothing beyond the basics (prompt_2 defaults to the prompt)"),
    "PIAPipeline": Matches(
        "pia", {**BASE, "frames": 2, "guidance_scale": 7.5, "image": IMAGE},
        {**CALL, "num_frames": 2, "guidance_scale": 7.5, "image": IMAGE},
        note="image: the first frame, which PIA animates"),
}

ENTRIES.update({
    "VideoToVideoSDPipeline": Matches(
        "video_to_video_sd", {"steps": 2, "guidance_scale": 6.0, "video": VIDEO},
        {"num_inference_steps": 2, "guidance_scale": 6.0, "video": VIDEO},
        input_size=(2, 16, 16),
        note="video: the input video; no height, width or frames (the output keeps the "
             "video's)"),
    "TextToVideoZeroPipeline": Matches(
        "text_to_video_zero", {"height": 16, "width": 16, "frames": 2, "steps": 3,
                               "guidance_scale": 7.5, "extra": {"t0": 0, "t1": 1}},
        {"height": 16, "width": 16, "video_length": 2, "num_inference_steps": 3,
         "guidance_scale": 7.5, "t0": 0, "t1": 1},
        note="frames are video_length; extra.t0/t1: the timesteps (counted from the end) "
             "between which the motion is warped in; their defaults 44 and 47 need 48 or "
             "more steps"),
    "TextToVideoZeroSDXLPipeline": Matches(
        "text_to_video_zero_sdxl", {"height": 16, "width": 16, "frames": 2, "steps": 3,
                                    "guidance_scale": 5.0, "extra": {"t0": 0, "t1": 1}},
        {"height": 16, "width": 16, "video_length": 2, "num_inference_steps": 3,
         "guidance_scale": 5.0, "t0": 0, "t1": 1},
        note="frames are video_length; extra.t0/t1 as for TextToVideoZeroPipeline"),
    "I2VGenXLPipeline": Matches(
        "i2vgenxl", {**BASE, "frames": 2, "guidance_scale": 6.0, "image": IMAGE,
                     "extra": {"clip_skip": None}},
        {**CALL, "num_frames": 2, "guidance_scale": 6.0, "image": IMAGE, "clip_skip": None},
        note="image: the first frame; extra.clip_skip: null (its default, 1, reads "
             "text_encoder.text_model, which transformers 5's CLIPTextModel no longer has); "
             "its VAE encode samples the image latents with no generator: Porter draws "
             "that noise from the device's key (set from the seed), PyTorch from its "
             "global generator, so frames differ by up to 2 levels (0 from the "
             "distribution's mean)",
        tolerance=2),
    "StableVideoDiffusionPipeline": Matches(
        "stable_video_diffusion",
        {"prompt": None, "image": IMAGE, "height": 16, "width": 16, "frames": 2, "steps": 2,
         "extra": {"min_guidance_scale": 1.0, "max_guidance_scale": 2.5}},
        {"prompt": None, "image": IMAGE, "height": 16, "width": 16, "num_frames": 2,
         "num_inference_steps": 2, "min_guidance_scale": 1.0, "max_guidance_scale": 2.5},
        input_size=(1, 16, 16),
        note="no prompt: generate.image (through a CLIP vision encoder) conditions it; its "
             "guidance ramps from extra.min_guidance_scale to extra.max_guidance_scale"),
})

