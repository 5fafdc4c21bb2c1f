"""The compiled programs of one HunyuanVideo video, at a recipe's shapes: what a run
calls the text encoders, the transformer and the VAE with (``porter compile`` lowers
them; tests hold them to what a tiny run calls).

HunyuanVideo 1.5's transformer is one program only with ``hunyuan.traceable_forward_15``
(diffusers' forward needs values; without the patch a run compiles its blocks one by
one, and ``porter compile`` finds those calls or says why it cannot).
"""

from __future__ import annotations

import torch

from porter.families import batch as guidance_batch
from porter.families import guided
from porter.aot.programs import Input, Program
from porter.transforms.dtypes import component_dtype

#: HunyuanVideo15Pipeline's own lengths: text tokens after its template, glyph tokens,
#: and the image tokens it passes (zeros for text-to-video); the template's tokens
#: before the prompt (``prompt_template_encode_start_idx``), encoded then cropped
TEXT_TOKENS_15, GLYPH_TOKENS_15, IMAGE_TOKENS_15 = 1000, 256, 729
TEMPLATE_TOKENS_15 = 108
#: HunyuanVideoPipeline's CLIP prompt length (``_get_clip_prompt_embeds``'s default)
CLIP_TOKENS = 77


def programs(family, recipe, modules: dict) -> list[Program]:
    shape = family.transformer_inputs(recipe, modules["transformer"].config)["hidden_states"]
    latents = (1, modules["vae"].config["latent_channels"], *shape[2:])
    found = _encode_15(family, recipe) if family.is_15(recipe) else _encode_v1(family, recipe)
    found.append(_transformer(family, recipe, modules["transformer"].config, shape))
    found.append(Program("vae", "decode", (Input(latents, component_dtype(recipe, "vae")),),
                         {"return_dict": False}, stage="decode"))
    return found


def _texts(family, recipe) -> list[str]:
    """The texts a video encodes: the prompt, then the negative prompt when guided."""
    gen = recipe.generate
    return [gen.prompt, gen.negative_prompt] if guided(family, recipe) else [gen.prompt]


def _each_text(texts: list[str]) -> str:
    return "the prompt, then the negative prompt" if len(texts) == 2 else "the prompt"


def _templated(texts: list[str], tokens: int) -> Program:
    """The language model's hidden states of each text inside the pipeline's prompt
    template, ``tokens`` long (the template's own tokens are encoded, then cropped)."""
    ids = Input((1, tokens), torch.int32)
    return Program("text_encoder", "forward", (), {
        "input_ids": ids, "attention_mask": ids, "output_hidden_states": True},
        calls=len(texts), stage="encode", note=_each_text(texts))


def _encode_v1(family, recipe) -> list[Program]:
    """Llama's hidden states of each text, and CLIP's pooled embedding of it."""
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import (
        DEFAULT_PROMPT_TEMPLATE,
    )

    texts = _texts(family, recipe)
    return [_templated(texts, family.text_length(recipe)
                       + DEFAULT_PROMPT_TEMPLATE["crop_start"]),
            Program("text_encoder_2", "forward", (Input((1, CLIP_TOKENS), torch.int32),),
                    {"output_hidden_states": False}, calls=len(texts), stage="encode",
                    note=_each_text(texts))]


def _encode_15(family, recipe) -> list[Program]:
    """Qwen's hidden states of each text, and ByT5's of the quoted words of each text
    that has some (one without encodes nothing there)."""
    from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import (
        extract_glyph_texts,
    )

    texts = _texts(family, recipe)
    found = [_templated(texts, TEXT_TOKENS_15 + TEMPLATE_TOKENS_15)]
    quoted = sum(extract_glyph_texts(text) is not None for text in texts)
    if quoted:
        found.append(Program("text_encoder_2", "forward", (), {
            "input_ids": Input((1, GLYPH_TOKENS_15), torch.int32),
            "attention_mask": Input((1, GLYPH_TOKENS_15), torch.float32)},
            calls=quoted, stage="encode", note="each text's quoted words"))
    return found


def _transformer(family, recipe, config, shape) -> Program:
    """One denoising call of the transformer, as the run batches its guidance."""
    dtype = component_dtype(recipe, "transformer")
    batch = guidance_batch(family, recipe)
    passes = 2 if guided(family, recipe) and batch == 1 else 1
    inputs, kind = (_inputs_15(config, batch, dtype), "classifier-free guidance") \
        if family.is_15(recipe) else \
        (_inputs_v1(config, batch, dtype, family.text_length(recipe)), "true guidance")
    if batch == 2:
        note = f"{kind}: cond and uncond batched"
    elif passes == 2:
        note = f"{kind}: cond and uncond, one call each"
    else:
        note = "one pass" if family.is_15(recipe) else "one pass (guidance is an embedded scale)"
    return Program("transformer", "forward", (), {
        "hidden_states": Input(shape, dtype), **inputs, "attention_kwargs": None,
        "return_dict": False}, calls=recipe.generate.steps * passes, note=note,
        per_step=passes)


def _inputs_15(config, batch: int, dtype) -> dict:
    """HunyuanVideo 1.5's text, glyph and (zero) image embeddings, as its pipeline
    pads them, and the timestep in the model's dtype."""
    return {"encoder_hidden_states": Input((batch, TEXT_TOKENS_15, config["text_embed_dim"]),
                                           dtype),
            "encoder_attention_mask": Input((batch, TEXT_TOKENS_15), dtype),
            "encoder_hidden_states_2": Input((batch, GLYPH_TOKENS_15,
                                              config["text_embed_2_dim"]), dtype),
            "encoder_attention_mask_2": Input((batch, GLYPH_TOKENS_15), dtype),
            "image_embeds": Input((batch, IMAGE_TOKENS_15, config["image_embed_dim"]), dtype),
            "timestep": Input((batch,), dtype)}


def _inputs_v1(config, batch: int, dtype, text_length: int) -> dict:
    """HunyuanVideo's Llama text embeddings, pooled CLIP embedding and guidance scale."""
    return {"encoder_hidden_states": Input((batch, text_length, config["text_embed_dim"]),
                                           dtype),
            "encoder_attention_mask": Input((batch, text_length), dtype),
            "pooled_projections": Input((batch, config["pooled_projection_dim"]), dtype),
            "guidance": Input((batch,), dtype),
            "timestep": Input((batch,), torch.float32)}
