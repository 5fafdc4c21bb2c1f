"""Wan-derived pipelines: Wan video-to-video and VACE, SkyReels-V2, ChronoEdit, Lucy Edit,
Wan Animate, Helios and AnyFlow."""

from matrix.entries import IMAGE, MASK, VIDEO, Matches

#: the tiny settings of the diffusers tests, under recipe names and the pipelines' own
T2V = {"height": 16, "width": 16, "frames": 9, "steps": 2, "guidance_scale": 6.0,
       "max_sequence_length": 16}
T2V_CALL = {"height": 16, "width": 16, "num_frames": 9, "num_inference_steps": 2,
            "guidance_scale": 6.0, "max_sequence_length": 16}
#: the same without the number of frames, for pipelines that take the input video's length
V2V = {key: value for key, value in T2V.items() if key != "frames"}
V2V_CALL = {key: value for key, value in T2V_CALL.items() if key != "num_frames"}

ENTRIES = {
    "SkyReelsV2Pipeline": Matches("skyreels_v2", T2V, T2V_CALL),
    "SkyReelsV2ImageToVideoPipeline": Matches(
        "skyreels_v2_i2v", {**T2V, "image": IMAGE}, {**T2V_CALL, "image": IMAGE},
        note="generate.image: the first frame"),
    "ChronoEditPipeline": Matches(
        "chronoedit", {**T2V, "frames": 5, "image": IMAGE},
        {**T2V_CALL, "num_frames": 5, "image": IMAGE},
        note="generate.image: the image to edit"),
    "WanVideoToVideoPipeline": Matches(
        "wan_v2v", {**V2V, "steps": 4, "video": VIDEO},
        {**V2V_CALL, "num_inference_steps": 4, "video": VIDEO},
        note="generate.video: the video to redraw; no generate.frames (the pipeline takes "
             "the video's length)"),
    "WanVACEPipeline": Matches(
        "wan_vace", {**T2V, "video": VIDEO, "mask": MASK},
        {**T2V_CALL, "video": VIDEO, "mask": MASK},
        note="generate.video and generate.mask: the video to inpaint and where"),
    "LucyEditPipeline": Matches(
        "lucy_edit", {**T2V, "video": VIDEO}, {**T2V_CALL, "video": VIDEO},
        note="generate.video: the video to edit"),
    "AnyFlowPipeline": Matches("anyflow", T2V, T2V_CALL),
    # a timestep table on the device indexed by rows made on the host: Porter's
    # host-index lowering (porter/shims/lowerings.py)
    "SkyReelsV2DiffusionForcingPipeline": Matches("skyreels_v2_df", T2V, T2V_CALL),
    "SkyReelsV2DiffusionForcingImageToVideoPipeline": Matches(
        "skyreels_v2_df_i2v", {**T2V, "image": IMAGE}, {**T2V_CALL, "image": IMAGE},
        note="generate.image: the first frame"),
    "SkyReelsV2DiffusionForcingVideoToVideoPipeline": Matches(
        "skyreels_v2_df_v2v",
        {**T2V, "frames": 17, "video": VIDEO,
         "extra": {"overlap_history": 3, "base_num_frames": 5}},
        {**T2V_CALL, "num_frames": 17, "video": VIDEO, "overlap_history": 3,
         "base_num_frames": 5},
        input_size=(7, 16, 16),
        note="generate.video: the video to continue (the output is its frames followed by "
             "generate.frames new ones); extra.overlap_history and base_num_frames: the "
             "long-video windows of diffusion forcing"),
    # x.type_as(a view): Porter's core.type_as (porter/shims/fixes.py)
    "HeliosPipeline": Matches(
        "helios", {**T2V, "guidance_scale": 1.0}, {**T2V_CALL, "guidance_scale": 1.0},
        note="frames are rounded up to whole chunks of 9 latent frames (33 frames)"),
    "HeliosPyramidPipeline": Matches(
        "helios_pyramid",
        {"height": 64, "width": 64, "frames": 9, "guidance_scale": 1.0,
         "max_sequence_length": 16, "extra": {"pyramid_num_inference_steps_list": [1, 1, 1]}},
        {"height": 64, "width": 64, "num_frames": 9, "guidance_scale": 1.0,
         "max_sequence_length": 16, "pyramid_num_inference_steps_list": [1, 1, 1]},
        note="no generate.steps: its steps are per pyramid stage, "
             "extra.pyramid_num_inference_steps_list (one count per level)"),
    # its transformer's calls at fixed shapes (porter/families/far.py)
    "AnyFlowFARPipeline": Matches(
        "anyflow_far", {**T2V, "extra": {"chunk_partition": [1, 1, 1]}},
        {**T2V_CALL, "chunk_partition": [1, 1, 1]},
        note="extra.chunk_partition (latent frames per autoregressive chunk); its "
             "transformer's calls at fixed shapes (porter/families/far.py: no new programs "
             "for a longer video up to the model's own length; docs/python-api.md, "
             "streaming); a step cache that skips blocks and compile.transformer.modules "
             "refused"),
    "WanAnimatePipeline": Matches(
        "wan_animate",
        {**V2V, "guidance_scale": 1.0, "image": IMAGE, "pose_video": VIDEO,
         "face_video": VIDEO},
        {**V2V_CALL, "guidance_scale": 1.0, "image": IMAGE, "pose_video": VIDEO,
         "face_video": VIDEO},
        note="generate.image (the character), generate.pose_video and generate.face_video "
             "(the motion and the expressions to follow; their length is the output's, so "
             "no generate.frames); generate.background_video and generate.mask for its "
             "replace mode (extra.mode: replace)"),
}
