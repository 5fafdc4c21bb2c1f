"""The three stages of a run, each timed: encode, denoise, decode."""

from __future__ import annotations

import sys
import time

from porter.interop import to_device, to_host
from porter.transforms.dtypes import DTYPES


def block(tensor) -> None:
    """Wait for a JAX computation to finish, so timings measure work, not dispatch."""
    if hasattr(tensor, "jax"):
        tensor.jax().block_until_ready()


def encode(family, pipe, recipe, runtime, timings: dict) -> dict:
    start = time.perf_counter()
    with runtime.env:
        conditioning = family.encode(pipe, recipe)
        if recipe.dtypes.text_embeddings:  # a stage-boundary cast the recipe asks for
            target = DTYPES[recipe.dtypes.text_embeddings]
            conditioning = {k: v.to(target) for k, v in conditioning.items()}
    for value in conditioning.values():
        block(value)
    timings["encode_s"] = round(time.perf_counter() - start, 4)
    return conditioning


def denoise(family, pipe, conditioning: dict, recipe, runtime, timings: dict,
            progress: bool = True):
    """Run every denoising step; the transformer compiles on the first one."""
    from tqdm import tqdm

    latents = to_device(family.initial_latents(pipe, recipe), runtime)
    step_times = []
    with runtime.env:
        timesteps = family.timesteps(pipe, recipe)
        bar = tqdm(total=len(timesteps), desc="denoise", unit="step", file=sys.stderr,
                   disable=not progress, dynamic_ncols=True)
        with bar:
            for t in timesteps:
                start = time.perf_counter()
                noise = family.predict(pipe, latents, t, conditioning, recipe)
                latents = pipe.scheduler.step(noise, t, latents, return_dict=False)[0]
                block(latents)
                step_times.append(time.perf_counter() - start)
                bar.set_postfix_str(f"{step_times[-1]:.2f} s/step")
                bar.update()
    timings["steps_s"] = [round(s, 4) for s in step_times]
    # The first step includes compiling the transformer; the rest are steady state.
    steady = step_times[1:] or step_times
    timings["step_s"] = round(sorted(steady)[len(steady) // 2], 4)
    return to_host(latents)


def decode(family, pipe, latents, recipe, runtime, timings: dict):
    start = time.perf_counter()
    with runtime.env:
        frames = family.decode(pipe, latents, recipe)
    timings["decode_s"] = round(time.perf_counter() - start, 4)
    return frames
