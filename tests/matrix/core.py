"""The pipelines Porter's plugin families run, and the first generic ones."""

from matrix.entries import VIDEO, Family, Matches, NotVideo, Refused

ENTRIES = {
    "WanPipeline": Family("wan", "tests/wan/test_variants.py"),
    "WanImageToVideoPipeline": Family("wan", "tests/wan/test_i2v.py"),
    "CogVideoXPipeline": Family("cogvideox", "tests/cogvideox/test_family.py"),
    "CogVideoXImageToVideoPipeline": Family("cogvideox", "tests/cogvideox/test_family.py"),
    "HunyuanVideoPipeline": Family("hunyuan", "tests/hunyuan/test_family.py"),
    "HunyuanVideo15Pipeline": Family("hunyuan", "tests/hunyuan/test_family.py"),
    "LattePipeline": Matches(
        "latte", {"height": 8, "width": 8, "frames": 1, "steps": 2, "guidance_scale": 5.0,
                  "extra": {"clean_caption": False}},
        {"height": 8, "width": 8, "video_length": 1, "num_inference_steps": 2,
         "guidance_scale": 5.0, "clean_caption": False},
        note="extra.clean_caption: false (its default needs bs4 and ftfy)"),
    "MochiPipeline": Matches(
        "mochi", {"height": 16, "width": 16, "frames": 7, "steps": 2, "guidance_scale": 4.5,
                  "max_sequence_length": 16},
        {"height": 16, "width": 16, "num_frames": 7, "num_inference_steps": 2,
         "guidance_scale": 4.5, "max_sequence_length": 16}),
    "SanaVideoPipeline": Matches(
        "sana_video", {"height": 32, "width": 32, "frames": 9, "steps": 2,
                       "guidance_scale": 6.0, "max_sequence_length": 16,
                       "extra": {"complex_human_instruction": [],
                                 "use_resolution_binning": False}},
        {"height": 32, "width": 32, "frames": 9, "num_inference_steps": 2,
         "guidance_scale": 6.0, "max_sequence_length": 16, "complex_human_instruction": [],
         "use_resolution_binning": False},
        note="extra.complex_human_instruction: [] and use_resolution_binning: false (the "
             "tiny model's defaults would rewrite the prompt and the size)"),
    "Kandinsky5T2VPipeline": Matches(
        "kandinsky5", {"height": 32, "width": 32, "frames": 5, "steps": 2,
                       "guidance_scale": 4.0, "max_sequence_length": 8},
        {"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 2,
         "guidance_scale": 4.0, "max_sequence_length": 8}),
    "AllegroPipeline": Matches(
        "allegro", {"height": 320, "width": 320, "frames": 24, "steps": 2,
                    "guidance_scale": 6.0, "max_sequence_length": 16,
                    "extra": {"clean_caption": False}},
        {"height": 320, "width": 320, "num_frames": 24, "num_inference_steps": 2,
         "guidance_scale": 6.0, "max_sequence_length": 16, "clean_caption": False},
        setup={"vae": ["enable_tiling"]},
        note="setup.vae: [enable_tiling] (its VAE decodes only tiled, in tiles of 24 x 320 "
             "x 320 pixels); extra.clean_caption: false"),
}

ENTRIES.update({
    "ConsisIDPipeline": Refused("needs torch, transformers, opencv, and one of them is not "
                                "installed here"),
    "LTXLatentUpsamplePipeline": Matches(
        "ltx_latent_upsample", {"prompt": None, "video": VIDEO, "height": 16, "width": 16},
        {"prompt": None, "video": VIDEO, "height": 16, "width": 16}, input_size=(5, 32, 32),
        note="generate.video (the video to upsample, resized to height x width first: the "
             "output is twice that); no prompt and no steps: it does not denoise"),
    "Kandinsky6SRPipeline": Matches(
        "kandinsky6_sr", {"prompt": None, "video": VIDEO, "steps": 2,
                          "extra": {"resolution_scale": 2}},
        {"prompt": None, "video": VIDEO, "num_inference_steps": 2, "resolution_scale": 2},
        input_size=(5, 32, 32),
        note="generate.video (the video to upscale, 1 + 4k frames); "
             "extra.resolution_scale (2, 2.25 or 4); no prompt, size or frames"),
    "Cosmos2TextToImagePipeline": NotVideo("makes images (Cosmos Predict2 text-to-image)"),
    "Kandinsky5T2IPipeline": NotVideo("makes images (Kandinsky 5 text-to-image)"),
    "Kandinsky5I2IPipeline": NotVideo("makes images (Kandinsky 5 image-to-image)"),
})
