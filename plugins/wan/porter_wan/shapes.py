"""Wan's shapes and costs, from a transformer's configuration and the recipe's sizes,
without weights: the transformer's inputs, tokens, rotary tables, the steps each
expert runs, what its positional tables cover, and one step's FLOPs."""

from __future__ import annotations

from porter.families import batch, guided
from porter.transforms import rotary
from porter.transforms import scheduler as scheduling


def transformer_inputs(family, recipe, config) -> dict[str, tuple[int, ...]]:
    gen, layout = recipe.generate, family.layout_or_default(recipe)
    count = batch(family, recipe)
    latent = (count, config["in_channels"], *layout.grid.latents(recipe))
    # TI2V: one timestep per token (the first frame's are 0 in image mode)
    timestep = (count, tokens(family, recipe, config)) if layout.expand_timesteps \
        else (count,)
    return {"hidden_states": latent, "timestep": timestep,
            "encoder_hidden_states": (count, gen.max_sequence_length, config["text_dim"])}


def tokens(family, recipe, config) -> int:
    """Video tokens of one transformer call: the latent grid cut into patches."""
    frames, height, width = family.layout_or_default(recipe).grid.latents(recipe)
    p_t, p_h, p_w = config["patch_size"]
    return (frames // p_t) * (height // p_h) * (width // p_w)


def rotary_tables(family, pipe, recipe) -> list:
    """Each expert's rotary tables, computed on the host in float64 by a fresh module
    (as diffusers computes them)."""
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    entries = []
    for model in family.experts(pipe):
        rope = model.rope
        fresh = WanRotaryPosEmbed(rope.attention_head_dim, rope.patch_size, rope.max_seq_len)
        shape = transformer_inputs(family, recipe, model.config)["hidden_states"]
        tables = rotary.host_tables(fresh, shape)
        entries.append((rope, tuple(shape[2:]), tables, rope.freqs_cos.dtype))
    return entries


def transformer_steps(family, pipe, recipe) -> dict[str, int]:
    """Two experts split the schedule (the recipe's, or its steps evenly spread) at the
    boundary timestep."""
    boundary = family.boundary(pipe)
    if boundary is None:
        return {"transformer": recipe.generate.steps}
    first = sum(1 for t in scheduling.planned(pipe.scheduler, recipe) if t >= boundary)
    return {"transformer": first, "transformer_2": recipe.generate.steps - first}


def size_problems(family, recipe, config) -> list:
    """Wan's rotary tables cover ``rope_max_seq_len`` positions on each axis of the
    patch grid; diffusers slices them to the grid, so a larger grid fails mid-step."""
    limit = config.get("rope_max_seq_len")
    if not limit:
        return []
    gen, layout = recipe.generate, family.layout_or_default(recipe)
    p_t, p_h, p_w = config["patch_size"]
    frames, height, width = layout.grid.latents(recipe)
    space, time = layout.spatial, layout.temporal
    axes = {"frames": (frames // p_t, time * p_t, "frames"),
            "height": (height // p_h, space * p_h, "pixels"),
            "width": (width // p_w, space * p_w, "pixels")}
    problems = []
    for key, (positions, per_position, unit) in axes.items():
        if positions > limit:
            problems.append(recipe.problem(
                f"generate.{key}", f"{getattr(gen, key)} {unit} make {positions} positions "
                f"on this axis; the model's rotary tables hold {limit}",
                hint=f"at most about {limit * per_position} {unit} "
                     f"(rope_max_seq_len {limit} x {per_position})"))
    return problems


def estimates(family, recipe, config) -> dict:
    """One denoising step's FLOPs (every guidance pass) and the shapes its attention and
    widest activations run at."""
    count = tokens(family, recipe, config)
    width = config["num_attention_heads"] * config["attention_head_dim"]
    text, ffn = recipe.generate.max_sequence_length, config["ffn_dim"]
    per_block = (2 * count * width * width * 4          # self-attention q, k, v, out
                 + 2 * 2 * count * count * width        # scores and weighted sum
                 + 2 * count * width * width * 2        # cross-attention q, out
                 + 2 * text * width * width * 2         # cross-attention k, v
                 + 2 * 2 * count * text * width         # cross scores and sum
                 + 2 * count * width * ffn * 2)         # FFN in and out
    passes = 2 if guided(family, recipe) else 1
    heads, calls = config["num_attention_heads"], batch(family, recipe)
    return {"tokens": count,
            "flops_per_step": passes * config["num_layers"] * per_block,
            # per transformer call (both passes in one batch only with cfg_parallel):
            # the widest activations of a block, its hidden states and FFN middle
            "activations": {"hidden": (calls, count, width), "ffn": (calls, count, ffn)},
            "attention": {"self": (calls, heads, count, count),
                          "cross": (calls, heads, count, text)},
            "layers": config["num_layers"], "calls_per_step": passes // calls}
