"""The compiled programs of one HunyuanVideo video, at a recipe's shapes: what
diffusers' ``HunyuanVideoPipeline`` calls the transformer and the VAE with (``porter
compile`` lowers them; tests hold them to what a tiny run calls).

HunyuanVideo 1.5's transformer is compiled block by block (its top-level forward
reorders text tokens by their mask's values), each block's inputs made by that
eager forward: only its VAE decode is declared.
"""

from __future__ import annotations

import torch

from porter.aot.programs import Input, Program
from porter.transforms.dtypes import component_dtype

#: HunyuanVideoPipeline's own text length (tokens kept after its prompt template)
TEXT_TOKENS = 256


def programs(family, recipe, modules: dict) -> list[Program]:
    gen = recipe.generate
    shape = family.transformer_inputs(recipe, modules["transformer"].config)["hidden_states"]
    latents = (1, modules["vae"].config["latent_channels"], *shape[2:])
    found = []
    if not family.is_15(recipe):
        config = modules["transformer"].config
        dtype = component_dtype(recipe, "transformer")
        text = gen.max_sequence_length if recipe.sets("generate.max_sequence_length") \
            else TEXT_TOKENS
        found.append(Program("transformer", "forward", (), {
            "hidden_states": Input(shape, dtype),
            "timestep": Input((1,), torch.float32),
            "encoder_hidden_states": Input((1, text, config["text_embed_dim"]), dtype),
            "encoder_attention_mask": Input((1, text), dtype),
            "pooled_projections": Input((1, config["pooled_projection_dim"]), dtype),
            "guidance": Input((1,), dtype),
            "attention_kwargs": None, "return_dict": False},
            calls=gen.steps, note="one pass (guidance is an embedded scale)", per_step=1))
    found.append(Program("vae", "decode", (Input(latents, component_dtype(recipe, "vae")),),
                         {"return_dict": False}, stage="decode"))
    return found
