"""The compiled programs of one Wan video, at a recipe's shapes: what ``WanFamily``'s
stages call each compiled component with (``porter compile`` lowers them with no
weights; tests hold them to what a tiny run calls).
"""

from __future__ import annotations

import torch

from porter.families import batch as guidance_batch
from porter.families import guided
from porter.aot.programs import Input, Program, carried_calls
from porter.loading.model_configs import checkpoint_root
from porter.transforms import scheduler as scheduling
from porter.transforms.dtypes import component_dtype
from porter_wan import decoding, shapes


def programs(family, recipe, modules: dict) -> list[Program]:
    """Encode (text, image), denoise (each expert, guidance passes as the run batches
    them) and decode, in the order a run makes them."""
    layout = family.layout_or_default(recipe)
    found = _encode(recipe, modules, layout)
    found += _denoise(family, recipe, modules, layout)
    found += _decode(recipe, modules, layout)
    return found


def _decode(recipe, modules, layout) -> list[Program]:
    """The streamed decode's calls (``decoding.chunks``): one latent frame each, the
    first with an empty cache; a tiled decode's one call."""
    latents = _latents(recipe, modules, layout, 1, "vae")
    channels, frames, *size = latents.shape[1:]
    vae = modules["vae"]
    if decoding.tiles(vae, *size):
        return [Program("vae", "decode", (latents,), {"return_dict": False},
                        stage="decode")]
    piece = Input((1, channels, 1, *size), latents.dtype)
    return carried_calls(vae, "vae", "decode_chunk", decoding.decode_chunk,
                         [(piece, {"first": index == 0}) for index in range(frames)],
                         decoding.empty_cache(vae))


def _encode(recipe, modules, layout) -> list[Program]:
    gen = recipe.generate
    guided = gen.guidance_scale > 1.0
    text = Input((1, gen.max_sequence_length), torch.int32)
    found = [Program("text_encoder", "forward", (text, text), calls=2 if guided else 1,
                     stage="encode", note="the prompt, then the negative prompt"
                     if guided else "the prompt")]
    if gen.image is None:
        return found
    if layout.image_dim is not None:  # CLIP tokens of the given frame(s)
        size = modules["image_encoder"].config.image_size
        images = 1 if gen.last_image is None else 2
        found.append(Program("image_encoder", "forward", (),
                             {"pixel_values": Input((images, 3, size, size), torch.float32),
                              "output_hidden_states": True}, stage="encode"))
    frames = 1 if layout.expand_timesteps else gen.frames  # the frames the VAE encodes
    found.append(Program("vae", "_encode", (Input((1, 3, frames, gen.height, gen.width),
                                                  component_dtype(recipe, "vae")),),
                         stage="encode", note="the given frame(s)"))
    return found


def _denoise(family, recipe, modules, layout) -> list[Program]:
    gen = recipe.generate
    batch = guidance_batch(family, recipe)
    passes = 2 if guided(family, recipe) and batch == 1 else 1
    found = []
    for name, steps in _expert_steps(family, recipe, layout).items():
        config = modules[name].config
        dtype = component_dtype(recipe, name)
        timestep = (batch, shapes.tokens(family, recipe, config)) if layout.expand_timesteps \
            else (batch,)
        kwargs = {"hidden_states": _latents(recipe, modules, layout, batch, name,
                                            config["in_channels"]),
                  "timestep": Input(timestep, torch.float32),
                  "encoder_hidden_states": Input((batch, gen.max_sequence_length,
                                                  config["text_dim"]), dtype),
                  "return_dict": False}
        if layout.image_dim is not None and gen.image is not None:
            # one row per image (FLF2V: two), the transformer joins a video's rows
            images = 1 if gen.last_image is None else 2
            kwargs["encoder_hidden_states_image"] = Input(
                (batch * images, _clip_tokens(modules["image_encoder"]), config["image_dim"]),
                dtype)
        note = ("cond and uncond batched" if batch == 2 else
                "cond and uncond, one call each" if passes == 2 else "one pass")
        if layout.boundary_ratio is not None:
            note += (f"; {steps} of {gen.steps} steps" if steps is not None else
                     "; its share of the steps (the boundary's split needs the "
                     "scheduler's configuration: a local checkpoint)")
        found.append(Program(name, "forward", (), kwargs,
                             calls=None if steps is None else steps * passes, note=note,
                             per_step=passes))
    return found


def _latents(recipe, modules, layout, batch, component, channels=None) -> Input:
    """Latents (batch, channels, frames, height, width) in ``component``'s dtype."""
    frames, height, width = layout.grid.latents(recipe)
    channels = channels or modules["vae"].config["z_dim"]
    return Input((batch, channels, frames, height, width), component_dtype(recipe, component))


def _clip_tokens(encoder) -> int:
    config = encoder.config
    return (config.image_size // config.patch_size) ** 2 + 1  # patches and the class token


def _expert_steps(family, recipe, layout) -> dict[str, int | None]:
    """Steps each transformer runs; two experts split the schedule at the boundary,
    which needs the scheduler's timesteps (None where its configuration is not at hand)."""
    steps = recipe.generate.steps
    if layout.boundary_ratio is None:
        return {"transformer": steps}
    scheduler = _scheduler(recipe)
    if scheduler is None:
        return {"transformer": None, "transformer_2": None}
    boundary = layout.boundary_ratio * scheduler.config.num_train_timesteps
    first = sum(1 for t in scheduling.planned(scheduler, recipe) if t >= boundary)
    return {"transformer": first, "transformer_2": steps - first}


def _scheduler(recipe):
    """The recipe's scheduler, built from its configuration (no weights)."""
    import json

    import diffusers

    from porter.recipe.sources import source_kind
    from porter_wan import tiny

    kind = source_kind(recipe.model.source)
    if kind == "tiny":
        return tiny.scheduler()
    root = checkpoint_root(recipe.model.source)
    path = root / "scheduler" / "scheduler_config.json" if root is not None else None
    if path is None or not path.is_file():
        return None
    config = json.loads(path.read_text())
    return getattr(diffusers, config["_class_name"]).from_config(config)
