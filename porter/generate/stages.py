"""The three stages of a run, each timed: encode, denoise, decode."""

from __future__ import annotations

import sys
import time

from porter.runtime import finite, interrupt
from porter.generate import guidance
from porter.errors import Interrupted, NonFinite, UsageError
from porter.shims.interop import to_device, to_host
from porter.rundir.progress import REDO as progress_redo
from porter.rundir.progress import Progress, restore_scheduler, scheduler_state
from porter.generate.sampling import Sampling
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
            conditioning = {k: v.to(target) if k in family.embedding_keys else v
                            for k, v in conditioning.items()}
    for value in conditioning.values():
        block(value)
    timings["encode_s"] = round(time.perf_counter() - start, 4)
    return conditioning


def denoise(family, pipe, conditioning: dict, recipe, runtime, timings: dict,
            progress: bool = True, *, start: Progress | None = None, save=None,
            on_step=None, reuse=None):
    """Run the denoising steps (from ``start`` when resuming); the transformer compiles
    on the first one. Each step is ``guidance.predict`` (``reuse``: the run's guidance
    cache, if any), then the family's ``step``.

    ``save(Progress)`` is called every ``output.checkpoint_every`` steps and,
    when a signal asks the run to stop, after the step under way; then
    ``Interrupted`` is raised (a signal, or ``interrupt.request_stop`` from another
    thread). ``on_step(done, total)`` is called after each step. Latents that turn NaN or infinite stop the run
    (``NonFinite``) at the step that made them; nothing of that step is saved.
    """
    from tqdm import tqdm

    sampling = Sampling.seeded(recipe.generate.seed)
    latents = to_device(family.initial_latents(pipe, recipe, sampling.generator), runtime)
    step_times = []
    every = recipe.output.checkpoint_every
    with runtime.env:
        timesteps = family.timesteps(pipe, recipe)
        sampling.timesteps = timesteps
        total, done = len(timesteps), 0
        if start is not None:
            if start.step > total:
                raise UsageError(f"{start.source}: step: {start.step} is not a completed "
                                 f"step of this {total}-step schedule (1..{total})",
                                 hint=progress_redo)
            latents, done = to_device(start.latents, runtime), start.step
            restore_scheduler(pipe.scheduler, start.scheduler_tensors,
                              start.scheduler_description, lambda t: to_device(t, runtime),
                              start.source, start.step)
            sampling.restore(start.sampling, lambda t: to_device(t, runtime))
        saved_at = done if start is not None else None
        bar = tqdm(total=total, initial=done, desc="denoise", unit="step", file=sys.stderr,
                   disable=not progress, dynamic_ncols=True)
        with bar, interrupt.deferred() as stop:
            for index in range(done, total):
                t = timesteps[index]
                sampling.index = index
                begin = time.perf_counter()
                noise = guidance.predict(family, pipe, latents, t, conditioning, recipe,
                                         sampling, reuse)
                latents = family.step(pipe, noise, t, latents, sampling)
                block(latents)
                if not finite.on_device(latents):
                    raise NonFinite(index + 1, total, saved_at)
                step_times.append(time.perf_counter() - begin)
                bar.set_postfix_str(f"{step_times[-1]:.2f} s/step")
                bar.update()
                completed = index + 1
                if on_step is not None:
                    on_step(completed, total)
                due = every and completed % every == 0 and completed < total
                signum = stop.agreed()
                if save is not None and (due or signum):
                    save(Progress(completed, latents, *scheduler_state(pipe.scheduler),
                                  sampling=sampling.state()))
                    saved_at = completed
                if signum:
                    raise Interrupted(
                        signum, saved=f"{completed} of {total} denoising steps"
                        if save is not None else None)
        latents = family.final_latents(pipe, latents, conditioning)
    timings["steps_s"] = [round(s, 4) for s in step_times]
    timings["resumed_from_step"] = done
    # The first step includes compiling the transformer; the rest are steady state.
    steady = step_times[1:] or step_times
    if steady:
        timings["step_s"] = round(sorted(steady)[len(steady) // 2], 4)
    return to_host(latents)


def decode(family, pipe, latents, recipe, runtime, timings: dict):
    start = time.perf_counter()
    with runtime.env:
        frames = family.decode(pipe, latents, recipe)
    timings["decode_s"] = round(time.perf_counter() - start, 4)
    return frames
