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
from dataclasses import dataclass, field
from pathlib import Path

from porter.port import checks, passes, porting
from porter.runtime import distributed, notices
from porter.transforms import patches
from porter.rundir import artifacts, record, results
from porter import runtime as runtime_mod
from porter.port import out_of_memory
from porter.generate import runners, schedulers, stages
from porter.shims import tracing
from porter.errors import RecipeError
from porter.recipe.inputs import INPUTS
from porter.shims.interop import to_device, to_host

#: where per-call settings come from, in error messages (not a file: relative paths
#: in them start from the current directory)
CALL = "Port.generate"


def load(recipe, *overrides: str, cpu_devices: int | None = None,
         progress: bool = False) -> "Port":
    """Validate, load, port and prepare the recipe's pipeline.

    ``recipe``: a recipe file (path) or a loaded ``porter.recipe.Recipe``;
    ``overrides``: ``"generate.steps=4"``-style strings, as on the command line;
    ``cpu_devices``: run on N virtual CPU devices (must come before JAX starts);
    ``progress``: print what is being done to stderr.

    Raises what the CLI reports: ``RecipeError`` (every problem, with file:line),
    ``UsageError``, ``LoadError`` (all ``porter.errors.PorterError``).
    """
    from porter import plugins
    from porter import recipe as recipe_mod

    if isinstance(recipe, (str, Path)):
        overrides = list(overrides)
        if cpu_devices is not None:
            overrides.append(f"runtime.cpu_devices={cpu_devices}")
        recipe = recipe_mod.load(recipe, overrides)
    elif overrides or cpu_devices is not None:
        raise TypeError("overrides and cpu_devices go with a recipe path, not a loaded "
                        "Recipe (load it with them instead)")
    registry = plugins.registry()
    family = checks.checked_family(recipe, registry)
    distributed.initialize()
    return Port.open(recipe, registry, family, say=status if progress else quiet)


def status(message: str) -> None:
    """A status line on stderr (what is being done), labelled with the process."""
    import sys

    print(f"porter: {distributed.label()}{message}", file=sys.stderr, flush=True)


def quiet(message: str) -> None:
    """``say`` that says nothing."""


@dataclass
class Outcome:
    """What one generation produced, before anything is written."""
    latents: object  # CPU torch tensor, or None (encode only; a pipeline that hides them)
    frames: object  # uint8 array (count, height, width, 3), or None (before decode)
    timings: dict
    history: list = field(default_factory=list)
    warnings: list = field(default_factory=list)  # given while loading and in this call


@dataclass
class Generation:
    """One video made by ``Port.generate``: ``frames`` (uint8, (count, height, width,
    3)), ``latents`` (CPU torch tensor: the final latents) and ``record`` (what
    ``run.json`` holds, less the files)."""
    frames: object
    latents: object
    record: dict
    recipe: object = field(repr=False, default=None)

    def save(self, directory) -> Path:
        """Write the video (and the frames and latents the recipe's ``output`` asks
        for) and ``run.json`` to ``directory``, as ``porter run`` does; returns the
        record's path."""
        from porter.rundir import outputs

        directory = Path(directory)
        with outputs.owned(directory):
            results.invalidate(directory, artifacts.STAGES, keep_progress=False)
            written = results.write_results(directory, self.recipe, self.frames,
                                            self.latents)
            data = dict(self.record)
            data["outputs"] = {**data["outputs"], **written}
            return record.write_json(directory / outputs.RECORD, data)


class Port:
    """A recipe's pipeline, loaded, placed on the mesh and compiled on first use.

    ``pipeline`` and ``transformer`` (and any ``component(name)``) are the ported
    modules; ``as_torch(name)`` calls one with torch tensors in and out.
    """

    def __init__(self, recipe, registry, family, runtime, pipe, ported, chosen,
                 checkpoint, load_timings: dict, compile_mark: dict):
        self.recipe = recipe
        self.registry = registry
        self.family = family
        self.runtime = runtime
        self.pipe = pipe
        self.ported = ported
        self.chosen = chosen  # the patches applied around every use
        self.checkpoint = checkpoint
        self.load_timings = load_timings
        self.calls = 0
        self._monitor = runtime_mod.compile_monitor()
        self._compile_mark = compile_mark  # compile totals before loading began
        self._traces_mark = (0, 0)
        self._load_warnings = notices.given()  # the load's: every record carries them

    # ------------------------------------------------------------------ building

    @classmethod
    def open(cls, recipe, registry, family, say=quiet) -> "Port":
        """Start the runtime, check shapes, load and port (see ``porter.load``)."""
        from porter.transforms import attention

        runtime = runtime_mod.start(recipe)
        say(f"JAX on {runtime.mesh.devices.size} {runtime.device_kind} device(s), "
            f"mesh {runtime.axes}" + (f", {distributed.process_count()} processes; "
                                      "process 0 writes the outputs"
                                      if distributed.process_count() > 1 else ""))
        problems = checks.shape_problems(recipe, registry)  # before any weight is read
        problems += attention.platform_problems(recipe, registry, runtime.platform)
        if problems:
            raise RecipeError(problems)
        compile_mark = runtime_mod.compile_monitor().summary()
        building = passes.Building(recipe, registry, family, runtime, say=say)
        with out_of_memory.explained(recipe, registry), building.stack, \
                tracing.explained():
            passes.build(building)
        return cls(recipe, registry, family, runtime, building.pipe, building.ported(),
                   building.chosen, building.checkpoint, building.timings, compile_mark)

    # ------------------------------------------------------------------ components

    @property
    def pipeline(self):
        return self.pipe

    @property
    def transformer(self):
        return self.pipe.transformer

    def component(self, name: str):
        return getattr(self.pipe, name)

    @contextlib.contextmanager
    def active(self):
        """The port's patches, attention backend and torchax environment, for calling
        its components directly (``generate`` and ``as_torch`` enter it themselves)."""
        with patches.applied(self.chosen), tracing.explained(), \
                porting.ops_installed(self.recipe, self.registry, self.runtime), \
                schedulers.on_device(getattr(self.pipe, "scheduler", None), self.runtime):
            yield self.runtime.env

    def as_torch(self, name: str = "transformer"):
        """The ported component ``name`` as a function of CPU torch tensors: arguments
        are moved onto the mesh, the compiled component runs, tensors in the result
        come back as CPU torch tensors (a teacher inside a PyTorch training loop)."""
        import torch

        module = self.component(name)

        def call(*args, **kwargs):
            with self.active() as env, env:
                moved = torch.utils._pytree.tree_map(self._to_mesh, (args, kwargs))
                out = module(*moved[0], **moved[1])
            return torch.utils._pytree.tree_map(
                lambda v: to_host(v) if isinstance(v, torch.Tensor) else v, out)
        return call

    def _to_mesh(self, value):
        import torch

        if isinstance(value, torch.Tensor) and not hasattr(value, "jax"):
            return to_device(value, self.runtime)
        return value

    # ------------------------------------------------------------------ generating

    def settings(self, source: str = CALL, line: int | None = None, **values):
        """The port's recipe with ``generate`` settings changed (``checked_settings``)."""
        return checked_settings(self.recipe, self.registry, values, source, line)

    def encode(self, prompt: str | None = None, **settings) -> dict:
        """The family's conditioning for a prompt (the encode stage: text embeddings for
        the prompt and the negative prompt, image latents for image-to-video), as CPU
        torch tensors by name (e.g. ``prompt``, ``negative``)."""
        if prompt is not None:
            settings["prompt"] = prompt
        recipe = self.settings(**settings)
        with self.active():
            found = stages.encode(self.family, self.pipe, recipe, self.runtime, {})
        return {name: to_host(value) for name, value in found.items()}

    def generate(self, prompt: str | None = None, **settings) -> Generation:
        """One video; any ``generate`` setting of the recipe may be given (prompt,
        negative_prompt, seed, image, last_image, video, mask, control_video, height,
        width, frames, steps, guidance_scale, ...). Returns a ``Generation``; nothing is written."""
        if prompt is not None:
            settings["prompt"] = prompt
        recipe = self.settings(**settings)
        outcome = self.run(recipe)
        return Generation(outcome.frames, outcome.latents, self.record(recipe, outcome),
                          recipe)

    def run(self, recipe, *, wanted: tuple[str, ...] = artifacts.STAGES, directory=None,
            resumed=None, progress: bool = False, on_step=None, say=quiet) -> Outcome:
        """Run the wanted stages of ``recipe`` (this port's recipe or one from
        ``settings``). With a ``directory``, each stage's output and the denoising
        checkpoints are saved there and ``resumed`` (``porter.generate.runners.Resumed``) says
        what to continue from; ``on_step(done, total)`` follows denoising."""
        self.calls += 1
        # loading is paid once: the first call's record carries it
        timings: dict = dict(self.load_timings) if self.calls == 1 else {}
        warned = len(notices.given())
        try:
            with out_of_memory.explained(recipe, self.registry):
                outcome = self._run(recipe, timings, wanted, directory, resumed, progress,
                                    on_step, say)
        finally:  # compilation a failed call paid is not charged to the next one
            timings["compile"] = self._compile_since_last()
        outcome.warnings = self._load_warnings + notices.given()[warned:]
        return outcome

    def _run(self, recipe, timings, wanted, directory, resumed, progress, on_step, say):
        runner = runners.of(self.family)
        previous = resumed.previous if resumed else None
        history = list(previous["meta"].get("history") or []) if previous else []
        # a step cache serves runs that denoise (a pipeline's own loop always does)
        caching = self.ported.caching if "denoise" in wanted or not self.family.staged \
            else None
        with self.active():
            # What a pipeline draws with no generator (I2VGen-XL's VAE encode samples
            # latent_dist without one) comes from the device's key, which each draw
            # moves on: from the seed at every call, so a call repeats in a process
            # that made others before it (a server, a notebook, a test worker).
            self.runtime.env.manual_seed(recipe.generate.seed % (1 << 63))  # JAX's range
            if caching is not None:
                self._begin_cache(caching, recipe, resumed)
            reuse = caching.guidance if caching is not None else None
            latents, frames, history = runner.generate(
                self, recipe, timings, history, wanted, directory, resumed, progress,
                on_step, say, reuse)
        timings["stages"] = list(wanted) if self.family.staged else list(runner.stages)
        timings["port_call"] = self.calls
        if caching is not None:
            timings["cache"] = caching.summary()
        return Outcome(latents, frames, timings, history)

    def _begin_cache(self, caching, recipe, resumed) -> None:
        """Every cache state cold; a run continued mid-denoise starts its cache there."""
        start = resumed.progress.step if resumed and resumed.progress else 0
        with self.runtime.env:
            caching.begin(self.pipe, self.family, recipe, start)
        if start:
            notices.warn(f"continuing after step {start}: the step cache starts cold there "
                         "(and TaylorSeer counts its steps from there), so the result can "
                         "differ slightly from an uninterrupted run")

    @property
    def inputs(self) -> dict:
        """The files what this port makes is made from (``artifacts.inputs_of``): each
        saved stage records them, so a resumed run can tell they are the same."""
        return artifacts.inputs_of(self.checkpoint)

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

    def record(self, recipe, outcome: Outcome, written: dict | None = None) -> dict:
        """The run record of one generation (``run.json``); ``written``: what
        ``results.write_results`` wrote."""
        described = {}
        if outcome.frames is not None:
            frames = outcome.frames
            described = {"frames": int(frames.shape[0]), "height": int(frames.shape[1]),
                         "width": int(frames.shape[2])}
        described.update(written or {})
        return record.build(recipe, self.runtime, outcome.timings, described, self.chosen,
                            self.ported.weights, self.checkpoint, outcome.history,
                            outcome.warnings)

    def close(self) -> None:
        """Let go of the pipeline (its device memory goes when nothing else holds it)."""
        self.pipe = None
        self.ported = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def checked_settings(recipe, registry, values: dict, source: str = CALL,
                     line: int | None = None):
    """``recipe`` with ``generate`` settings changed, checked as ``porter validate``
    checks them, without weights (``RecipeError``, every problem); ``source`` and
    ``line`` name where the values came from in messages. Relative image paths start
    from that file's folder when there is a line, else from the current directory."""
    from porter import recipe as recipe_mod

    values = {k: str(v) if isinstance(v, Path) else v for k, v in values.items()}
    if line is None:
        values.update({k: str(Path(values[k]).expanduser().absolute())
                       for k in INPUTS if isinstance(values.get(k), str)})
    changed = recipe_mod.with_values(recipe, "generate", values, source, line)
    problems = checks.recipe_problems(changed, registry) or _pipeline_problems(
        recipe, changed, registry)
    if not problems and _shape_keys_changed(recipe, changed):
        problems = checks.shape_problems(changed, registry)
    if problems:
        raise RecipeError(problems)
    return changed


def _pipeline_problems(recipe, changed, registry) -> list:
    """Settings that need another pipeline than the one the port loaded (an image for
    a port loaded for text-to-video, or none for an image-to-video one)."""
    family = registry.family(recipe.model.family)
    loaded, wanted = family.pipeline_class(recipe), family.pipeline_class(changed)
    if loaded is wanted:
        return []
    return [changed.problem("generate.image", f"needs {wanted.__name__}, but this port "
                            f"loaded {loaded.__name__} for its recipe", hint="load a recipe "
                            "that sets generate.image for image-to-video, or leave image "
                            "out for text-to-video")]


#: generate settings that decide tensor shapes (checked against the model when changed)
SHAPE_KEYS = ("height", "width", "frames", *INPUTS, "max_sequence_length", "cfg_parallel",
              "guidance_scale")


def _shape_keys_changed(before, after) -> bool:
    return any(getattr(before.generate, k) != getattr(after.generate, k) for k in SHAPE_KEYS)
