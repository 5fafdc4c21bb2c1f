"""Classifier-free guidance, one mechanism for every staged family.

A family says how to call its transformer for one branch (``ModelFamily.call``)
and which conditioning entries belong to which branch
(``ModelFamily.guidance_pairs``: conditional entry -> unconditional entry); the
core decides how the branches run (``porter.families.guided`` and ``batch``):

- unguided (``ModelFamily.cfg_scale`` <= 1: ``encode`` made no unconditional
  entries): one call;
- ``generate.cfg_parallel``: both branches as one batch of 2, [cond, uncond]
  (the data axis can split it);
- otherwise two calls, each with its own step-cache state (``cond``, ``uncond``);
- with the guidance cache (``cache.method: guidance``), some steps compute only the
  conditional branch and estimate the other (``porter.stepcache.guidance``).

The prediction is ``uncond + scale * (cond - uncond)``, the scale from
``ModelFamily.denoiser`` (two experts may guide differently; a schedule may vary it).
"""

from __future__ import annotations

import torch

from porter import stepcache as cache
from porter.families import batch


def predict(port, call, latents, conditioning: dict, sampling):
    """The guided noise prediction for the step ``sampling`` is at (the call's guidance
    cache, if the recipe has one, may estimate the unconditional branch)."""
    family, pipe, recipe = port.family, port.pipe, call.recipe
    timestep, reuse = sampling.timesteps[sampling.index], call.guidance_cache
    model, scale = family.denoiser(pipe, timestep, sampling, recipe)
    model_input = family.model_input(pipe, latents, timestep, conditioning, model)
    pairs = {key: negative for key, negative in family.guidance_pairs.items()
             if key in conditioning}  # a family may pair entries only some models make
    cond = {key: conditioning[key] for key in pairs}
    if not all(negative in conditioning for negative in pairs.values()):
        with cache.context(model, "cond"):
            return family.call(model, model_input, timestep, cond, conditioning)
    uncond = {key: conditioning[negative] for key, negative in pairs.items()}
    if reuse is not None and not reuse.computes_unconditional(model):
        with cache.context(model, "cond"):
            noise = family.call(model, model_input, timestep, cond, conditioning)
        return _combined(noise, reuse.estimated(noise), scale)
    if batch(family, recipe) == 2:
        both = {key: torch.cat([cond[key], uncond[key]]) for key in pairs}
        with cache.context(model, "cond_uncond"):
            noise, unguided = family.call(model, torch.cat([model_input, model_input]),
                                          timestep, both, conditioning).chunk(2)
    else:  # each branch keeps its own step-cache state
        with cache.context(model, "cond"):
            noise = family.call(model, model_input, timestep, cond, conditioning)
        with cache.context(model, "uncond"):
            unguided = family.call(model, model_input, timestep, uncond, conditioning)
    if reuse is not None:
        reuse.kept(noise, unguided)
    return _combined(noise, unguided, scale)


def _combined(cond, uncond, scale: float):
    return uncond + scale * (cond - uncond)
