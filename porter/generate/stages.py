"""The three stages of a staged run, each timed into its call: encode, denoise, decode.

Each takes the port (its family, pipeline and runtime) and the call (``Call``: the
recipe, where to report, what to fill in).
"""

from __future__ import annotations

import time

import numpy as np

from porter.errors import Interrupted, NonFinite, UsageError
from porter.generate import guidance, preview, streaming
from porter.generate.call import Call
from porter.generate.sampling import Sampling
from porter.rundir import record
from porter.rundir.progress import REDO, Progress, restore_scheduler, scheduler_state
from porter.runtime import atomic, distributed, finite, interrupt, notices
from porter.shims.interop import to_device, to_host
from porter.transforms import scheduler as scheduling
from porter.transforms.dtypes import DTYPES


def block(tensor) -> None:
    """Wait for a JAX computation to finish, so timings measure work, not dispatch."""
    if hasattr(tensor, "jax"):
        tensor.jax().block_until_ready()


def encode(port, call: Call) -> dict:
    """The family's conditioning (text embeddings, image latents), on the mesh."""
    family, recipe = port.family, call.recipe
    start = time.perf_counter()
    with port.runtime.env:
        conditioning = family.encode(port.pipe, recipe)
        if recipe.dtypes.text_embeddings:  # a stage-boundary cast the recipe asks for
            target = DTYPES[recipe.dtypes.text_embeddings]
            conditioning = {k: v.to(target) if k in family.embedding_keys else v
                            for k, v in conditioning.items()}
    for value in conditioning.values():
        block(value)
    call.timings["encode_s"] = round(time.perf_counter() - start, 4)
    return conditioning


def denoise(port, call: Call, conditioning: dict, save=None):
    """The denoising steps (after the call's checkpoint, when it continues one); the
    transformer compiles on the first. Each step is ``guidance.predict``, then the
    family's ``step``.

    ``save(Progress)`` is called every ``output.checkpoint_every`` steps and, when a
    signal asks the run to stop, after the step under way; then ``Interrupted`` is
    raised (a signal, or ``interrupt.request_stop`` from another thread). Latents that
    turn NaN or infinite stop the run (``NonFinite``) at the step that made them;
    nothing of that step is saved. Returns the final latents on the host.
    """
    family, pipe = port.family, port.pipe
    sampling = Sampling.seeded(call.recipe.generate.seed)
    latents = to_device(family.initial_latents(pipe, call.recipe, sampling.generator),
                        port.runtime)
    with port.runtime.env:
        sampling.timesteps = scheduling.timesteps(family, pipe, call.recipe)
        call.schedule = scheduling.describe(pipe.scheduler, sampling.timesteps)
        latents = _continued(port, call, latents, sampling)
        steps = _Steps(call, len(sampling.timesteps))
        with steps, interrupt.deferred() as stop:
            for index in range(call.first_step, steps.total):
                begin, sampling.index = time.perf_counter(), index
                with port.stepping(call, index):  # each pass's part around a step
                    latents = _step(port, call, latents, conditioning, sampling)
                if not finite.bounded(size := finite.magnitude(latents)):
                    raise NonFinite(index + 1, steps.total, steps.saved_at, magnitude=size)
                steps.finished(index + 1, time.perf_counter() - begin)
                _preview(port, steps, latents)
                _save_or_stop(port, steps, latents, sampling, stop.agreed(), save)
        latents = family.final_latents(pipe, latents, conditioning)
    call.timings.update(steps.timings())
    call.history = denoised_history(port, call, steps.done)
    return to_host(latents)


def _continued(port, call: Call, latents, sampling: Sampling):
    """The call's checkpoint put back (its latents, the scheduler's state, the random
    stream), or ``latents`` as they are for a call that starts at the first step."""
    start = call.resumed.progress if call.resumed else None
    if start is None:
        return latents
    changed = scheduling.differences(start.schedule, call.schedule) \
        if start.schedule is not None else []
    if changed:
        raise UsageError(f"{start.source}: its steps were taken on another schedule: "
                         + "; ".join(changed[:4]) + (" ..." if len(changed) > 4 else ""),
                         hint="resume with the scheduler and "
                         "schedule that made it, or " + REDO)
    total = len(sampling.timesteps)
    if start.step > total:
        raise UsageError(f"{start.source}: step: {start.step} is not a completed step of "
                         f"this {total}-step schedule (1..{total})", hint=REDO)
    call.say(f"continuing denoising after step {start.step}")
    call.history = list(start.history) or call.history

    def placed(tensor):
        return to_device(tensor, port.runtime)
    restore_scheduler(port.pipe.scheduler, start.scheduler_tensors,
                      start.scheduler_description, placed, start.source, start.step)
    sampling.restore(start.sampling, placed)
    return placed(start.latents)


def _step(port, call: Call, latents, conditioning: dict, sampling: Sampling):
    """One denoising step: the guided prediction, then the scheduler's step."""
    timestep = sampling.timesteps[sampling.index]
    noise = guidance.predict(port, call, latents, conditioning, sampling)
    latents = port.family.step(port.pipe, noise, timestep, latents, sampling)
    block(latents)
    return latents


def _preview(port, steps: "_Steps", latents) -> None:
    """``preview.png`` in the call's directory when one is due (``preview``); its cost
    counted in the call's timings. Every process computes it (the latents and the
    fit's decode may span them all); process 0 writes it. A call with no directory (a
    server's warm-up) fits the map and writes nothing, so a first job compiles
    nothing new. A preview that fails turns previews off for the port, with a
    warning: the video matters more than its picture."""
    call = steps.call
    every = call.preview_every if call.preview_every is not None \
        else call.recipe.output.preview_every
    previews = port.previews
    if not every or steps.done % every or not port.family.previews or previews.off:
        return  # (a served job's default asks for previews of any family)
    start = time.perf_counter()
    failed, writes = None, call.directory is not None and distributed.writes()
    try:
        image = previews.image(port.family, port.pipe, call.recipe, to_host(latents))
        if writes:
            atomic.write_bytes(call.directory / preview.FILE, preview.png(image))
    except (OSError, ValueError, RuntimeError, TypeError) as exc:
        failed = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    # off for every process or none: the next preview's collectives need them all
    if distributed.anywhere(failed is not None):
        previews.off = True
        notices.warn(f"live previews are off for this model: "
                     f"{failed or 'another process could not make or write one'}",
                     hint="the run goes on; set output.preview_every: 0 to skip them")
        return
    spent = call.timings.setdefault("preview", {"every": every, "written": 0, "seconds": 0.0})
    spent["written"] += writes
    spent["seconds"] = round(spent["seconds"] + time.perf_counter() - start, 4)
    spent["fit_s"] = previews.colours.fit_s  # inside the first preview's seconds
    spent["fit_rms_levels"] = previews.colours.residual


def _save_or_stop(port, steps: "_Steps", latents, sampling: Sampling, signum, save) -> None:
    """A checkpoint when one is due or a signal asks the run to stop; then the stop."""
    every = steps.call.recipe.output.checkpoint_every
    due = every and steps.done % every == 0 and steps.done < steps.total
    if save is not None and (due or signum):
        save(Progress(steps.done, latents, *scheduler_state(port.pipe.scheduler),
                      sampling=sampling.state(), schedule=steps.call.schedule))
        steps.saved_at = steps.done
    if signum:
        raise Interrupted(signum, saved=f"{steps.done} of {steps.total} denoising steps"
                          if save is not None else None)


class _Steps:
    """The loop's bookkeeping: steps done, each one's time, the last step saved, the
    progress bar, the call's ``on_step``."""

    def __init__(self, call: Call, total: int):
        self.call, self.total, self.done = call, total, call.first_step
        self.seconds: list[float] = []
        start = call.resumed.progress if call.resumed else None
        self.saved_at = start.step if start is not None else None
        self.bar = notices.progress_bar(total, self.done, "denoise", "step", call.progress)

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def finished(self, done: int, seconds: float) -> None:
        self.seconds.append(seconds)
        self.done = done
        self.bar.set_postfix_str(f"{self.seconds[-1]:.2f} s/step")
        self.bar.update()
        if self.call.on_step is not None:
            self.call.on_step(done, self.total)

    def timings(self) -> dict:
        found = {"steps_s": [round(s, 4) for s in self.seconds],
                 "resumed_from_step": self.call.first_step}
        # The first step includes compiling the transformer; the rest are steady state.
        steady = self.seconds[1:] or self.seconds
        if steady:
            found["step_s"] = round(sorted(steady)[len(steady) // 2], 4)
        return found


def denoised_history(port, call: Call, done: int) -> list:
    """Where the stages so far ran, with this call's denoising steps up to ``done``."""
    return call.history + [record.segment(port.runtime, "denoise",
                                          steps=[call.first_step, done])]


def decode(port, call: Call, latents):
    """Latents (host tensor) to frames (uint8 array), each chunk handed on as the
    family's decode makes it (``streaming``: the call's ``on_frames``, stream.mp4)."""
    start = time.perf_counter()
    made = []
    with port.runtime.env, streaming.stream(call) as on_frames:
        for chunk in port.family.decode_chunks(port.pipe, latents, call.recipe):
            made.append(chunk)
            on_frames(chunk)
    call.timings["decode_s"] = round(time.perf_counter() - start, 4)
    return made[0] if len(made) == 1 else np.concatenate(made)
