"""The compiled programs of one CogVideoX video, at a recipe's shapes: what a run calls
each compiled component with (``porter compile`` lowers them; tests hold them to what a
tiny run calls).
"""

from __future__ import annotations

import torch

from porter.families import batch as guidance_batch
from porter.families import guided as guidance_guided
from porter.aot.programs import Input, Program, carried_calls
from porter.transforms.dtypes import component_dtype
from porter_cogvideox import decoding


def programs(family, recipe, modules: dict) -> list[Program]:
    gen = recipe.generate
    config = modules["transformer"].config
    guided, batch = guidance_guided(family, recipe), guidance_batch(family, recipe)
    passes = 2 if guided and batch == 1 else 1
    dtype = component_dtype(recipe, "transformer")
    text = family.text_length(recipe)
    frames, height, width = _latent_grid(recipe, modules)
    padded = frames + (-frames % config["patch_size_t"] if config.get("patch_size_t") else 0)
    found = [Program("text_encoder", "forward", (Input((1, text), torch.int32),),
                     calls=2 if guided else 1, stage="encode",
                     note="the prompt, then the negative prompt" if guided else "the prompt")]
    kwargs = {"hidden_states": Input((batch, padded, config["in_channels"], height, width),
                                     dtype),
              "encoder_hidden_states": Input((batch, text, config["text_embed_dim"]), dtype),
              "timestep": Input((batch,), torch.int32)}
    if family.is_i2v(recipe):  # CogVideoX1.5-I2V's frame-rate embedding, or None
        kwargs["ofs"] = Input((1,), dtype) if config.get("ofs_embed_dim") else None
    kwargs["image_rotary_emb"] = _rotary(config, padded, height, width)
    kwargs.update(attention_kwargs=None, return_dict=False)
    note = ("cond and uncond batched" if batch == 2 else
            "cond and uncond, one call each" if passes == 2 else "one pass")
    found.append(Program("transformer", "forward", (), kwargs, calls=gen.steps * passes,
                         note=note, per_step=passes))
    vae = modules["vae"]
    channels, dtype = vae.config["latent_channels"], component_dtype(recipe, "vae")
    if decoding.tiles(vae, height, width):  # one call, tile by tile
        found.append(Program("vae", "decode", (Input((1, channels, frames, height, width),
                                                     dtype),), stage="decode"))
        return found
    # the streamed decode's calls (decoding.chunks): a batch of latent frames each
    found += carried_calls(vae, "vae", "decode_chunk", decoding.decode_chunk, [
        (Input((1, channels, end - start, height, width), dtype), {})
        for start, end in decoding.batches(frames, vae.num_latent_frames_batch_size)], None)
    return found


def _latent_grid(recipe, modules) -> tuple[int, int, int]:
    gen = recipe.generate
    vae = modules["vae"].config
    spatial = 2 ** (len(vae["block_out_channels"]) - 1)
    temporal = vae["temporal_compression_ratio"]
    return (gen.frames - 1) // temporal + 1, gen.height // spatial, gen.width // spatial


def _rotary(config, frames: int, height: int, width: int):
    """The rotary tables the pipeline hands the transformer: (cos, sin), one row per
    token of the patch grid; None where the model has no rotary embedding."""
    if not config.get("use_rotary_positional_embeddings"):
        return None
    patch, patch_t = config["patch_size"], config.get("patch_size_t") or 1
    tokens = (frames // patch_t) * (height // patch) * (width // patch)
    table = Input((tokens, config["attention_head_dim"]), torch.float32)
    return (table, table)
