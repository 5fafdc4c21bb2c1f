"""Porter as a library: load and port a recipe's pipeline once, generate many times.

``porter.load(recipe)`` validates, loads, ports and prepares the pipeline and
returns a ``Port``; ``Port.generate(prompt=..., seed=..., ...)`` makes one
video with any generation setting changed for that call, and returns a
``Generation`` (frames, final latents, run record; ``.save(directory)``).
A call whose shapes match an earlier one compiles nothing. ``porter run``, its
``--prompts`` batches and ``porter serve`` all run on a ``Port``.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from porter import recipe as recipe_mod
from porter import registry as registry_mod
from porter import runtime as runtime_mod
from porter.errors import RecipeError, UsageError
from porter.generate import preview, runners, stages
from porter.generate.call import Call, Outcome
from porter.loading import release
from porter.port import active, checks, out_of_memory, passes
from porter.recipe import Recipe
from porter.rundir import artifacts, outputs, record, results
from porter.runtime import distributed, monitor, notices
from porter.shims import tracing
from porter.shims.interop import to_device, to_host
from porter.transforms import Calling
from porter.transforms import scheduler as scheduling
from porter.transforms.building import Building

if TYPE_CHECKING:
    from porter.families.base import ModelFamily
    from porter.registry import Registry


def load(recipe: str | Path | Recipe, *overrides: str, cpu_devices: int | None = None,
         progress: bool = False) -> "Port":
    """Validate, load, port and prepare the recipe's pipeline.

    ``recipe``: a recipe file (path) or a loaded ``porter.recipe.Recipe``;
    ``overrides``: ``"generate.steps=4"``-style strings, as on the command line;
    ``cpu_devices``: run on N virtual CPU devices (must come before JAX starts);
    ``progress``: print what is being done to stderr.

    Raises what the CLI reports: ``RecipeError`` (every problem, with file:line),
    ``UsageError``, ``LoadError`` (all ``porter.errors.PorterError``).
    """
    if isinstance(recipe, os.PathLike):  # a DirEntry, pytest's tmpdir: a path
        recipe = Path(os.fspath(recipe))
    if not isinstance(recipe, (str, Path, Recipe)):
        raise UsageError(f"porter.load takes a recipe file's path or a loaded Recipe, "
                         f"not {type(recipe).__name__}",
                         hint='porter.load("recipes/wan-tiny.yaml")')
    strange = next((o for o in overrides if not isinstance(o, str)), None)
    if strange is not None:  # a list of them, as argparse would hold them
        raise UsageError(f"porter.load's overrides are strings KEY=VALUE, each its own "
                         f"argument, not {type(strange).__name__}",
                         hint='porter.load(recipe, "generate.steps=2", "mesh.dp=1")'
                         + (", or porter.load(recipe, *overrides)"
                            if isinstance(strange, (list, tuple)) else ""))
    if isinstance(recipe, (str, Path)):
        overrides = list(overrides)
        if cpu_devices is not None:
            overrides.append(f"runtime.cpu_devices={cpu_devices}")
        recipe = recipe_mod.load(recipe, overrides)
    elif overrides or cpu_devices is not None:
        raise TypeError("overrides and cpu_devices go with a recipe path, not a loaded "
                        "Recipe (load it with them instead)")
    registry = registry_mod.loaded()
    recipe = release.resolved(recipe, registry)  # an original release's folder as source
    family = checks.checked_family(recipe, registry)
    distributed.initialize()
    return Port.open(recipe, registry, family,
                     say=notices.status if progress else notices.quiet)


@dataclass
class Generation:
    """One video made by ``Port.generate``: ``frames`` (uint8, (count, height, width,
    3)), ``latents`` (CPU torch tensor: the final latents), ``record`` (what
    ``run.json`` holds, less the files) and ``audio`` (``porter.rundir.audio.Audio``:
    ``samples`` (channels, count) and ``rate``, where the pipeline makes sound)."""
    frames: object
    latents: object
    record: dict
    recipe: object = field(repr=False, default=None)
    audio: object = None  # the sound made with the frames (porter.rundir.audio.Audio)

    def save(self, directory) -> Path:
        """Write the video (and the frames and latents the recipe's ``output`` asks
        for) and ``run.json`` to ``directory``, as ``porter run`` does; returns the
        record's path."""
        directory = Path(directory)
        with outputs.owned(directory, "Porter's Python API (Generation.save)"):
            results.invalidate(directory, artifacts.STAGES, keep_progress=False)
            written = results.write_results(directory, self.recipe, self.frames,
                                            self.latents, self.audio)
            data = dict(self.record)
            data["outputs"] = {**data["outputs"], **written}
            return record.write_json(directory / outputs.RECORD, data)


class Port:
    """A recipe's pipeline, loaded, placed on the mesh and compiled on first use.

    ``pipeline`` and ``transformer`` (and any ``component(name)``) are the ported
    modules; ``as_torch(name)`` calls one with torch tensors in and out.
    """

    opened = 0  # ports this process opened (the first one's record has its start-up)

    def __init__(self, built: Building, compile_mark: dict):
        self.recipe = built.recipe
        self.registry = built.registry
        self.family = built.family
        self.runtime = built.runtime
        self.pipe = built.pipe
        self.ported = built.ported()
        self.load_timings = built.timings
        self.calls = 0
        self._monitor = monitor.compile_monitor()
        self._compile_mark = compile_mark  # compile totals before loading began
        self._traces_mark = (0, 0)
        self._load_warnings = notices.given()  # the load's: every record carries them
        self.previews = preview.Previews()  # live previews' map, fitted once per port

    # ------------------------------------------------------------------ building

    @classmethod
    def open(cls, recipe: Recipe, registry: Registry, family: ModelFamily,
             say=notices.quiet) -> "Port":
        """Start the runtime, check shapes, load and port (see ``porter.load``)."""
        first = not cls.opened  # a later port's start-up would be the process's age
        cls.opened += 1
        runtime = runtime_mod.start(recipe)
        processes = distributed.process_count()
        say(f"JAX on {runtime.mesh.devices.size} {runtime.device_kind} device(s), "
            f"mesh {runtime_mod.mesh_text(runtime.axes)}"
            + (f", {processes} processes; process 0 writes the outputs"
               if processes > 1 else ""))
        problems = checks.shape_problems(recipe, registry)  # before any weight is read
        problems += checks.runtime_problems(recipe, registry, runtime)
        if problems:
            raise RecipeError(problems)
        compile_mark = monitor.compile_monitor().summary()
        building = Building(recipe, registry, family, runtime, say=say)
        if first:  # what the process spent before its first port began loading: the
            # interpreter, imports (torch, JAX and the model's modules are imported where
            # first used, up to the shape checks), JAX's start and every check
            building.timings["startup_s"] = monitor.process_seconds()
        with out_of_memory.explained(recipe, registry), building.stack, \
                tracing.explained():
            passes.build(building)
        return cls(building, compile_mark)

    # ------------------------------------------------------------------ components

    @property
    def pipeline(self):
        return self._open_pipe()

    @property
    def transformer(self):
        return self._open_pipe().transformer

    def component(self, name: str):
        """The ported module ``name`` (``transformer``, ``vae``, ``text_encoder``, ...)."""
        found = getattr(self._open_pipe(), name, None)
        if not isinstance(found, torch.nn.Module):
            names = sorted(key for key, value in self.pipe.components.items()
                           if isinstance(value, torch.nn.Module))
            raise UsageError(f"no component {name!r} in this port",
                             hint=f"its components: {', '.join(names)}")
        return found

    def _open_pipe(self):
        """The pipeline, or why there is none: a closed port has let it go."""
        if self.pipe is None:
            raise UsageError("this port is closed (port.close(), or its with block "
                             "ended)", hint="load it again: porter.load(recipe)")
        return self.pipe

    def calling(self, call: Call | None = None) -> Calling:
        """What the passes' call-time parts work with for ``call`` (None: components
        called directly, with the port's recipe)."""
        return Calling(call.recipe if call is not None else self.recipe, self.registry,
                       self.family, self.runtime, self.ported, self._open_pipe(), call)

    @contextlib.contextmanager
    def active(self):
        """Every pass's call-time part (``porter.port.active``: the patches, the attention
        backend, the scheduler's tables) and the torchax environment, for calling the
        port's components directly (``generate`` and ``as_torch`` enter it themselves)."""
        with active.entered(self.calling()):
            yield self.runtime.env

    def stepping(self, call: Call, step: int):
        """Around one denoising step of ``call``: each pass's part for a transformer's
        calls (the attention window's grid and dense phase)."""
        return active.entered(self.calling(call).at_step(step))

    def as_torch(self, name: str = "transformer"):
        """The ported component ``name`` as a function of CPU torch tensors: arguments
        are moved onto the mesh, the compiled component runs, tensors in the result
        come back as CPU torch tensors (a teacher inside a PyTorch training loop)."""
        module = self.component(name)
        stepped = name in self.family.stepped_transformers  # as the denoising steps

        def call(*args, **kwargs):
            calling = self.calling()
            entered = active.transformer_calls(calling) if stepped \
                else active.entered(calling)
            with entered, self.runtime.env:
                moved = torch.utils._pytree.tree_map(self._to_mesh, (args, kwargs))
                out = module(*moved[0], **moved[1])
            return torch.utils._pytree.tree_map(
                lambda v: to_host(v) if isinstance(v, torch.Tensor) else v, out)
        return call

    def _to_mesh(self, value):
        if isinstance(value, torch.Tensor) and not hasattr(value, "jax"):
            return to_device(value, self.runtime)
        return value

    # ------------------------------------------------------------------ generating

    def settings(self, source: str = checks.CALL, line: int | None = None, **values):
        """The port's recipe with ``generate`` settings changed (``checks.with_settings``),
        its schedule checked against the scheduler the port loaded."""
        changed = checks.with_settings(self.recipe, self.registry, values, source, line)
        scheduler = getattr(self.pipe, "scheduler", None)
        problems = scheduling.schedule_problems(changed, type(scheduler)) \
            if scheduler is not None else []
        if problems:
            raise RecipeError(problems)
        return changed

    def encode(self, prompt: str | None = None, **settings) -> dict:
        """The family's conditioning for a prompt (the encode stage: text embeddings for
        the prompt and the negative prompt, image latents for image-to-video), as CPU
        torch tensors by name (e.g. ``prompt``, ``negative``)."""
        if prompt is not None:
            settings["prompt"] = prompt
        recipe = self.settings(source="Port.encode", **settings)
        with self.active():
            found = stages.encode(self, Call(recipe))
        return {name: to_host(value) for name, value in found.items()}

    def generate(self, prompt: str | None = None, *, on_frames=None,
                 **settings) -> Generation:
        """One video; any ``generate`` setting of the recipe may be given (prompt,
        negative_prompt, seed, image, last_image, video, mask, control_video, height,
        width, frames, steps, guidance_scale, ...). Returns a ``Generation``; nothing is
        written. ``on_frames(chunk)`` gets the frames as the decode makes them (uint8
        (count, height, width, 3), in order; Wan's: the first frame, then four at a time)."""
        if prompt is not None:
            settings["prompt"] = prompt
        recipe = self.settings(**settings)
        outcome = self.run(Call(recipe, on_frames=on_frames))
        return Generation(outcome.frames, outcome.latents,
                          self.run_record(recipe, outcome), recipe, outcome.audio)

    def run(self, call: Call) -> Outcome:
        """Run ``call``: the stages it wants of its recipe (this port's, or one from
        ``settings``). With a ``directory``, each stage's output and the denoising
        checkpoints are saved there and ``call.resumed`` says what to continue from."""
        self._open_pipe()
        self.calls += 1
        if self.calls == 1:  # loading is paid once: the first call's record carries it
            call.timings.update(self.load_timings)
        warned = len(notices.given())
        kept = self.ported.encodings
        before = kept.counts() if kept is not None else None
        try:
            with out_of_memory.explained(call.recipe, self.registry):
                latents, frames = self._run(call)
        finally:  # compilation a failed call paid is not charged to the next one
            call.timings["compile"] = self._compile_since_last()
            if kept is not None:  # text encoder calls this call answered from memory
                call.timings["text_encoding"] = {
                    key: value - before[key] for key, value in kept.counts().items()}
        return Outcome(latents, frames, call.timings, call.history,
                       list(dict.fromkeys(self._load_warnings + call.warnings
                                          + notices.given()[warned:])), call.stage_files,
                       call.schedule, call.audio)

    def _run(self, call: Call):
        runner = runners.of(self.family)
        with active.entered(self.calling(call)):  # every pass's call-time part
            # What a pipeline draws with no generator (I2VGen-XL's VAE encode samples
            # latent_dist without one) comes from the device's key, which each draw
            # moves on: from the seed at every call, so a call repeats in a process
            # that made others before it (a server, a notebook, a test worker).
            self.runtime.env.manual_seed(call.recipe.generate.seed % (1 << 63))  # JAX's
            latents, frames = runner.generate(self, call)
        call.timings["stages"] = list(call.wanted) if self.family.staged \
            else list(runner.stages)
        call.timings["port_call"] = self.calls
        return latents, frames

    @property
    def inputs(self) -> dict:
        """The files what this port makes is made from (``artifacts.inputs_of``): each
        saved stage records them, so a resumed run can tell they are the same."""
        return artifacts.inputs_of(self.ported.checkpoint)

    def _compile_since_last(self) -> dict:
        """Compilation since the previous call (the first call counts loading's)."""
        now = self._monitor.summary()
        spent = {key: round(now[key] - self._compile_mark[key], 4) for key in now}
        self._compile_mark = now
        traces = self.ported.traces
        if traces is not None:
            loaded, exported = traces.loaded, traces.exported
            spent.update(traces_loaded=loaded - self._traces_mark[0],
                         traces_saved=exported - self._traces_mark[1])
            self._traces_mark = (loaded, exported)
        split = {name: s.report() for name, s in self.ported.splits.items() if s.report()}
        if split:
            spent["split"] = split
        return spent

    def run_record(self, recipe: Recipe, outcome: Outcome,
                   written: dict | None = None) -> dict:
        """The run record of one generation (``run.json``); ``written``: what
        ``results.write_results`` wrote."""
        described = {}
        if outcome.frames is not None:
            frames = outcome.frames
            described = {"frames": int(frames.shape[0]), "height": int(frames.shape[1]),
                         "width": int(frames.shape[2])}
        described.update(written or {})
        return record.build(recipe, self.runtime, self.ported, outcome, described)

    def close(self) -> None:
        """Let go of the pipeline (its device memory goes when nothing else holds it)."""
        self.pipe = None
        self.ported = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
