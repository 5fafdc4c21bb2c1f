"""The compiled programs of one HunyuanVideo video, at a recipe's shapes: what a run
calls the transformer and the VAE with (``porter compile`` lowers them; tests hold them
to what a tiny run calls).

HunyuanVideo 1.5's transformer is compiled block by block (its top-level forward
reorders text tokens by their mask's values), each block's inputs made by that
eager forward: only its VAE decode is declared.
"""

from __future__ import annotations

import torch

from porter import guidance
from porter.aot.programs import Input, Program
from porter.transforms.dtypes import component_dtype


def programs(family, recipe, modules: dict) -> list[Program]:
    gen = recipe.generate
    shape = family.transformer_inputs(recipe, modules["transformer"].config)["hidden_states"]
    latents = (1, modules["vae"].config["latent_channels"], *shape[2:])
    found = []
    if not family.is_15(recipe):
        config = modules["transformer"].config
        dtype = component_dtype(recipe, "transformer")
        text, batch = family.text_length(recipe), guidance.batch(family, recipe)
        passes = 2 if guidance.guided(family, recipe) and batch == 1 else 1
        note = ("true guidance: cond and uncond batched" if batch == 2 else
                "true guidance: cond and uncond, one call each" if passes == 2 else
                "one pass (guidance is an embedded scale)")
        found.append(Program("transformer", "forward", (), {
            "hidden_states": Input(shape, dtype),
            "timestep": Input((batch,), torch.float32),
            "encoder_hidden_states": Input((batch, text, config["text_embed_dim"]), dtype),
            "encoder_attention_mask": Input((batch, text), dtype),
            "pooled_projections": Input((batch, config["pooled_projection_dim"]), dtype),
            "guidance": Input((batch,), dtype),
            "attention_kwargs": None, "return_dict": False},
            calls=gen.steps * passes, note=note, per_step=passes))
    found.append(Program("vae", "decode", (Input(latents, component_dtype(recipe, "vae")),),
                         {"return_dict": False}, stage="decode"))
    return found
