"""LTX-Video, LTX-2 and HunyuanVideo variants."""

from matrix.entries import IMAGE, MASK, VIDEO, Matches  # noqa: F401

#: why every LTX-2 pipeline fails under torchax 0.0.13 (two torchax gaps, both in code
#: all LTX-2 pipelines share)
LTX2_WHY = (
    "porter.stages.NonFinite: denoising step 1 of 2 made NaN or infinite latents "
    "(raised by porter/generic.py:48, the step watch). Two torchax gaps, both shown "
    "outside Porter with the components alone: (1) the Gemma3 text encoder's prompt is "
    "left-padded to max_sequence_length, so the padding rows of its causal boolean "
    "attention mask are fully masked; torchax's scaled_dot_product_attention "
    "(torchax/ops/jtorch.py:139, masked_fill -inf then softmax) gives NaN for such rows "
    "where PyTorch gives 0, and the NaN reaches the connectors and the transformer. "
    "(2) With no padding at all (max_sequence_length 6 = the prompt's tokens, "
    "guidance_scale 1) it runs but differs (19 pixel levels; latents by 0.19): "
    "diffusers' apply_split_rotary_emb (transformer_ltx2.py:75-76) updates views of "
    "its output with addcmul_, which torchax runs as a decomposition whose self "
    "is first materialised from the View (torchax/tensor.py:610-611; only bernoulli_ "
    "is in MUTABLE_DECOMPOSITION, decompositions.py:793), so the write never reaches "
    "the parent and the rotary embedding loses its sine term (add_ and copy_ on a "
    "view work). Fixes belong in torchax or as Porter core patches.")

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
}

FAILING = {
    "LTXI2VLongMultiPromptPipeline": (Matches(
        "ltx_i2v_long_multi_prompt",
        {"height": 32, "width": 32, "frames": 9, "steps": 2, "max_sequence_length": 16,
         "extra": {"seed": None}},
        {"height": 32, "width": 32, "num_frames": 9, "num_inference_steps": 2,
         "max_sequence_length": 16, "seed": None},
        note="extra.seed: null (its own seed argument, default 0, makes a "
             "torch.Generator on the pipeline's device for each window, which JAX's device "
             "cannot hold; null uses generate.seed's generator throughout); runs from the "
             "prompt alone (prompts split by '|' make the segments): its first-frame "
             "argument is cond_image, which no generate key names"),
        "Runs but differs (max pixel difference 171; final latents with output_type latent "
        "match to 1e-6). Not a torchax gap: a diffusers bug that Porter's step watch "
        "triggers. Porter passes callback_on_step_end (porter/generic.py _StepWatch, tensor "
        "inputs [latents]); the pipeline hands the callback locals()[latents] (the "
        "global, unpacked latents) but stores the callback's answer back into latents_packed "
        "(diffusers pipeline_ltx_i2v_long_multi_prompt.py:1351-1354), so even an identity "
        "callback replaces the window's packed latents: plain diffusers with an identity "
        "callback differs from itself without one by the same 171 levels. Porter could leave "
        "the step watch out for this class (or pass callback_on_step_end=None); extra.seed: "
        "null is needed besides, since the default seed=0 makes torch.Generator(device=<jax "
        "device>) per window (pipeline line 1246: RuntimeError: Please register "
        "PrivateUse1HooksInterface)."),
    "HunyuanVideoImageToVideoPipeline": (Matches(
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
        "porter.tracing.PortingError: model code failed under Porter (OperatorNotFound: "
        "Operator with name aten::_is_all_true has no lowering), raised in the Llava text "
        "encoder: transformers/models/llava/modeling_llava.py:210 (get_placeholder_mask) "
        "calls torch_compilable_check (transformers/utils/import_utils.py:1993), i.e. "
        "torch._check_tensor_all_with, which dispatches aten::_is_all_true; torchax 0.0.13 "
        "has no lowering for it (torchax/tensor.py:490, _get_op_or_decomp). Plain diffusers "
        "runs (5 finite frames). A torchax gap (a one-line lowering, or a Porter core patch "
        "making the check a no-op as core.no_torch_assert does for torch._assert); the real "
        "HunyuanVideo-I2V text encoder is the same Llava class, so real checkpoints hit it "
        "too."),
    "LTX2Pipeline": (Matches(
        "ltx2", {"height": 32, "width": 32, "frames": 5, "steps": 2,
                 "max_sequence_length": 16, "extra": {"frame_rate": 25.0}},
        {"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 2,
         "max_sequence_length": 16, "frame_rate": 25.0},
        note="video and audio; Porter keeps the video frames (output.frames)"), LTX2_WHY),
}

PROPOSED_REFUSALS = {
    "LTX2VideoDiffusionDecodePipeline": "it decodes latents another LTX-2 run made (its only "
    "input is a latents tensor), so no recipe can start it: run the LTX-2 pipeline itself.",
    "LTX2DFRTemporalRefinePipeline": "it refines a previous LTX-2 DFR run (it needs that "
    "run's latents, keyframe latents and positions, and audio latents as tensors), which no "
    "recipe can give.",
}
