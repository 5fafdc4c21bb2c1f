"""Modular pipelines (``ModularPipeline``: blocks assembled at run time), each run from a
recipe naming the class in ``model.pipeline`` and compared with diffusers' own modular
run (the class from the checkpoint, ``load_components``, the guidance scale on its
guider). Where diffusers has a classic pipeline of the same model its tiny checkpoint
serves (diffusers maps model_index.json onto the blocks); the rest are saved as modular
checkpoints (modular_model_index.json)."""

from matrix.entries import IMAGE, MASK, VIDEO, Matches

#: the Wan tests' tiny settings, under recipe names and the blocks' own
WAN = {"height": 16, "width": 16, "frames": 9, "steps": 2, "guidance_scale": 6.0,
       "max_sequence_length": 16}
WAN_CALL = {"height": 16, "width": 16, "num_frames": 9, "num_inference_steps": 2,
            "guidance_scale": 6.0, "max_sequence_length": 16}
WAN_I2V = {**WAN, "height": 32, "width": 32, "image": IMAGE}
WAN_I2V_CALL = {**WAN_CALL, "height": 32, "width": 32, "image": IMAGE}
LTX2 = {"height": 32, "width": 32, "frames": 5, "steps": 2, "max_sequence_length": 16,
        "extra": {"frame_rate": 25.0}}
LTX2_CALL = {"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 2,
             "max_sequence_length": 16, "frame_rate": 25.0}
PYRAMID = {"height": 64, "width": 64, "frames": 9, "guidance_scale": 1.0,
           "max_sequence_length": 16, "extra": {"pyramid_num_inference_steps_list": [1, 1, 1]}}
PYRAMID_CALL = {"height": 64, "width": 64, "num_frames": 9, "guidance_scale": 1.0,
                "max_sequence_length": 16, "pyramid_num_inference_steps_list": [1, 1, 1]}
ANIMATE = {"image": IMAGE, "video": VIDEO, "height": 32, "width": 32, "steps": 2,
           "max_sequence_length": 16, "extra": {"segment_frame_length": 5}}
ANIMATE_CALL = {"image": IMAGE, "driving_video": VIDEO, "height": 32, "width": 32,
                "num_inference_steps": 2, "max_sequence_length": 16,
                "segment_frame_length": 5}

ENTRIES = {
    "WanModularPipeline": Matches(
        "wan_t2v", WAN, WAN_CALL,
        note="generate.guidance_scale sets the guider's scale (the blocks take none)"),
    "Wan22ModularPipeline": Matches(
        "wan22_t2v", WAN, WAN_CALL,
        note="two experts; generate.guidance_scale sets the first guider, "
             "guidance_scale_2 the second's"),
    "WanImage2VideoModularPipeline": Matches(
        "wan_i2v", WAN_I2V, WAN_I2V_CALL, input_size=(9, 32, 32),
        note="generate.image: the first frame (generate.last_image the last)"),
    "Wan22Image2VideoModularPipeline": Matches(
        "wan22_i2v", WAN_I2V, WAN_I2V_CALL, input_size=(9, 32, 32),
        note="generate.image: the first frame"),
    "Wan22VaceModularPipeline": Matches(
        "wan22_vace", {**WAN, "video": VIDEO, "mask": MASK},
        {**WAN_CALL, "video": VIDEO, "mask": MASK},
        note="generate.video and generate.mask: the video to inpaint and where"),
    "HunyuanVideo15ModularPipeline": Matches(
        "hunyuan_video15", {"height": 32, "width": 32, "frames": 9, "steps": 2},
        {"height": 32, "width": 32, "num_frames": 9, "num_inference_steps": 2}),
    "LTXModularPipeline": Matches(
        "ltx", {"height": 32, "width": 32, "frames": 9, "steps": 2, "guidance_scale": 3.0,
                "max_sequence_length": 16},
        {"height": 32, "width": 32, "num_frames": 9, "num_inference_steps": 2,
         "guidance_scale": 3.0, "max_sequence_length": 16}),
    "LTX2ModularPipeline": Matches(
        "ltx2", LTX2, LTX2_CALL, note="video and audio"),
    # flex attention (the diffusion decoder's neighbourhood window): Porter's, every score
    # at once at this size (the square of the decoder's tokens): the smallest grid
    "LTX25ModularPipeline": Matches(
        "ltx25", {**LTX2, "height": 12, "width": 12, "frames": 3},
        {**LTX2_CALL, "height": 12, "width": 12, "num_frames": 3},
        note="video and audio; its diffusion decoder, not the VAE, makes the frames (here "
             "48x48 from 12x12, 9 from 3); its neighbourhood attention is flex attention, "
             "block by block where large (core.flex_attention)"),
    "HeliosModularPipeline": Matches(
        "helios", {**WAN, "guidance_scale": 1.0}, {**WAN_CALL, "guidance_scale": 1.0},
        note="frames are rounded up to whole chunks of 9 latent frames (33 frames)"),
    "HeliosPyramidModularPipeline": Matches(
        "helios_pyramid", PYRAMID, PYRAMID_CALL,
        note="its steps are per pyramid stage: extra.pyramid_num_inference_steps_list"),
    "HeliosPyramidDistilledModularPipeline": Matches(
        "helios_pyramid_distilled", PYRAMID, PYRAMID_CALL,
        note="its steps are per pyramid stage: extra.pyramid_num_inference_steps_list"),
    "Cosmos3OmniModularPipeline": Matches(
        "cosmos3_omni", {"height": 16, "width": 16, "frames": 5, "steps": 2},
        {"height": 16, "width": 16, "num_frames": 5, "num_inference_steps": 2},
        note="video (and sound where the checkpoint has a sound tokenizer)"),
    "Cosmos3DistilledModularPipeline": Matches(
        "cosmos3_distilled", {"height": 16, "width": 16, "frames": 5},
        {"height": 16, "width": 16, "num_frames": 5},
        note="no generate.steps: the checkpoint's distilled_sigmas fix them"),
}

ENTRIES.update({
    "MiniMaxH3ModularPipeline": Matches(
        "minimax_h3", {"height": 32, "width": 32, "frames": 124, "steps": 2},
        {"height": 32, "width": 32, "num_frames": 124, "num_inference_steps": 2},
        note="video and stereo sound; frames: 5 to 15 seconds at 24 fps, 17n + 5 (124 is "
             "the fewest); its scheduler counts the final sigma as a step (steps: 2 is one "
             "transformer pass)"),
    "EchoModularPipeline": Matches(
        "echo", {"image": IMAGE, "height": 32, "width": 32, "frames": 9,
                 "max_sequence_length": 16, "sigmas": [1.0, 0.5, 0.0],
                 "extra": {"frame_rate": 25.0}},
        {"image": IMAGE, "height": 32, "width": 32, "num_frames": 9,
         "max_sequence_length": 16, "sigmas": [1.0, 0.5, 0.0], "frame_rate": 25.0},
        input_size=(9, 32, 32),
        note="video and sound; its steps are generate.sigmas (no steps argument); "
             "generate.image is the optional first frame"),
    "WanAnimate2ModularPipeline": Matches(
        "wan_animate2", ANIMATE, ANIMATE_CALL, input_size=(9, 32, 32),
        note="generate.image (the character) and generate.video (the driving video, whose "
             "motion it follows and whose length is the output's); "
             "extra.segment_frame_length: frames per segment"),
    "WanAnimate2DistilledModularPipeline": Matches(
        "wan_animate2_distilled", ANIMATE, ANIMATE_CALL, input_size=(9, 32, 32),
        note="as WanAnimate2ModularPipeline, without classifier-free guidance"),
})
