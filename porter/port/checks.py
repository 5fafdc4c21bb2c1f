"""Every check that needs no weights: what `porter validate` runs."""

from __future__ import annotations

import difflib
from pathlib import Path

from porter.port import passes
from porter.recipe.inputs import INPUTS
from porter.loading import abstract, config_values
from porter.recipe import sources
from porter.transforms import attention, lora
from porter.errors import Problem, RecipeError, UsageError

# Building a model on the meta device takes no memory, but time grows with its
# size: num_layers: 1000000 would build for hours. Torch calls per build, by
# source: a tiny model with model.config (a 14B-shaped Wan takes ~6k; this is
# about 370 blocks), a local checkpoint (Wan 2.2 A14B, two experts, takes 25k).
MAX_BUILD_CALLS = {"tiny": 50_000, "local": 250_000}


def family_problems(recipe, registry) -> list[Problem]:
    name = recipe.model.family
    if name in registry.families:
        return []
    close = difflib.get_close_matches(name, list(registry.families), n=1)
    known = ", ".join(sorted(registry.families)) or "none"
    hint = f"did you mean {close[0]!r}?" if close else f"registered families: {known}"
    return [recipe.problem("model.family", f"unknown model family {name!r}", hint=hint)]


def _path_problem(recipe, key: str, value: str, from_recipe: bool) -> list[Problem]:
    try:
        # where the checks below look: model.source from the current directory,
        # an input file (generate.image, ...) from the recipe's folder
        path = recipe.file_path(key, value) if from_recipe else Path(value).expanduser()
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return []  # missing: the checks that need it say what they expected
    except (UsageError, RuntimeError):  # '~name/...' for a user this machine does not have
        return [recipe.problem(key, f"cannot expand {value.split('/')[0]!r}: no such user",
                               hint="write the path out in full")]
    except (OSError, ValueError) as exc:  # too long, no permission, a symlink loop
        reason = getattr(exc, "strerror", None) or str(exc)
        return [recipe.problem(key, f"cannot look at this path: {reason}",
                               hint="check the path and its permissions")]
    return []


def path_problems(recipe) -> list[Problem]:
    """Paths the system refuses even to look at. The other checks ask whether these
    paths exist, and for such a path that question raises instead of answering."""
    problems = []
    if recipe.model.source != sources.TINY:
        problems += _path_problem(recipe, "model.source", recipe.model.source, False)
    for key in INPUTS:
        if getattr(recipe.generate, key):
            problems += _path_problem(recipe, f"generate.{key}",
                                      getattr(recipe.generate, key), True)
    return problems


def required_problems(recipe, family) -> list[Problem]:
    """generate settings the family needs that the recipe leaves out (its other checks
    read them)."""
    return [recipe.problem(f"generate.{key}", f"family {family.name!r} needs "
                           f"generate.{key}", hint=f"set generate.{key}")
            for key in family.required if getattr(recipe.generate, key) is None]


def recipe_problems(recipe, registry) -> list[Problem]:
    """Schema-level problems that need the plugins but not JAX or weights: the family's
    checks, then every pass's (``porter.port.passes``)."""
    problems = path_problems(recipe)
    if problems:
        return problems  # the checks below would trip over the same paths
    problems = family_problems(recipe, registry)
    family = None
    if not problems:
        family = registry.family(recipe.model.family)
        problems += required_problems(recipe, family) or family.check(recipe)
    return problems + passes.check_problems(recipe, registry, family)


class _TooLarge(Exception):
    pass


def _call_budget(limit: int):
    """A torch function mode that raises _TooLarge after ``limit`` torch calls."""
    from torch.overrides import TorchFunctionMode

    class CallBudget(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.calls += 1
            if self.calls > limit:
                raise _TooLarge
            return func(*args, **(kwargs or {}))

    return CallBudget()


def model_problems(recipe, registry) -> list[Problem]:
    """Build the model on the meta device, as the shape checks will, and turn a failure
    into a problem: model.config goes verbatim to the family's constructor, and a local
    checkpoint's model_index.json and config.json files are input as much as the recipe."""
    kind = sources.source_kind(recipe.model.source)
    if kind == "tiny" and recipe.model.config:
        key, what = "model.config", "this configuration"
    elif kind == "local":
        key, what = "model.source", "the configuration files in this checkpoint"
        try:
            values = config_values.problems(Path(recipe.model.source).expanduser())
        except Exception:  # noqa: BLE001 - an unreadable index: the build below says why
            values = []
        if values:
            return [recipe.problem(key, problem, hint="the checkpoint's configuration is "
                                   "damaged: re-download it, or re-save the pipeline with "
                                   "save_pretrained") for problem in values]
    else:
        return []
    from porter.loading import abstract

    family = registry.family(recipe.model.family)
    try:
        with _call_budget(MAX_BUILD_CALLS[kind]):
            built = abstract.components(family, recipe)
    except _TooLarge:
        return [recipe.problem(key, f"{what} builds a model too large to check (over "
                               f"{MAX_BUILD_CALLS[kind]} torch calls)",
                               hint="a tiny model needs a few layers; real sizes come "
                                    "from a checkpoint" if kind == "tiny" else None)]
    except UsageError as exc:
        return [recipe.problem(key, exc.message, hint=exc.hint)]
    # What the constructor or the file parser said about the input, whatever its
    # type (TypeError for a string, JSONDecodeError, IndexError for a short entry).
    except Exception as exc:  # noqa: BLE001
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        return [recipe.problem(key, f"the {family.name} model cannot be built from {what}: "
                               f"{type(exc).__name__}: {reason}",
                               hint="check the values' types and sizes" if kind == "tiny"
                               else "is it a complete diffusers directory, as written by "
                                    "save_pretrained?")]
    return tiny_config_problems(recipe, built) if kind == "tiny" else []


def tiny_config_problems(recipe, built: dict) -> list[Problem]:
    """``model.config`` values the transformer builds from but cannot be right, judged
    as a checkpoint's config.json is (``num_layers: -3`` builds a model of no blocks)."""
    transformer = (built or {}).get("transformer")
    if transformer is None:
        return []
    return [recipe.problem(f"model.config.{key}", why, hint="check the values' types "
                           "and sizes") for key, why in config_values.value_problems(
                               dict(recipe.model.config), "diffusers", type(transformer))]


def input_problems(recipe, registry) -> list[Problem]:
    """The recipe, then the model it names built from its configuration (a tiny
    model's ``model.config``, a local checkpoint's config files) on the meta device:
    what `validate` checks first and what every command that loads a model checks
    before loading, so that both refuse the same input with the same message."""
    return recipe_problems(recipe, registry) or model_problems(recipe, registry)


def mesh_problems(recipe, devices: int | None = None, platform: str | None = None,
                  target: str | None = None) -> list[Problem]:
    """Does the mesh fit the devices JAX sees (imports JAX), or ``devices`` devices
    (checked as if: no JAX devices needed, nor the platform, unless the recipe names
    it or ``platform`` is given)? And does the attention backend run on the platform?"""
    from porter import plugins, runtime

    if devices is None:
        runtime.configure(recipe.runtime.platform, recipe.runtime.cpu_devices)
        import jax
        count, platform = jax.device_count(), jax.default_backend()
    else:
        count, platform = devices, platform or recipe.runtime.platform
    try:
        runtime.resolve_mesh(recipe.mesh, count, given=devices is not None, target=target)
    except UsageError as exc:
        return [recipe.problem("mesh", exc.message, hint=exc.hint)]
    if platform == "auto":
        return []  # where it will run is not known: `run` checks the backend there
    return attention.platform_problems(recipe, plugins.registry(), platform)


def shape_problems(recipe, registry, devices: int | None = None) -> list[Problem]:
    """Sharding rules and sizes against the model's shapes (meta device, no weights),
    for the devices JAX sees or ``devices`` devices; with the devices JAX sees, also
    the memory one layer's attention needs against what a device has."""
    from porter.port import plan

    try:
        built = plan.build(recipe, registry, devices)
    except UsageError:
        return []  # no configuration to check against (e.g. a hub id, offline)
    problems = built["problems"]
    if devices is None:
        problems += memory_problems(recipe, registry, built)
    return problems


def memory_problems(recipe, registry, built: dict) -> list[Problem]:
    """Attention scores that cannot fit beside the weights on a device, with a backend
    that materialises them all (torchax's default, ``reference``)."""
    from porter.port import plan as plan_mod
    from porter.runtime import device_memory

    if not attention.backends.materialises(recipe.attention.backend, registry.attention):
        return []
    memory = device_memory(built["devices"])
    need = plan_mod.attention_need(recipe, registry, built)
    if memory is None or need is None or need["bytes"] <= memory.bytes:
        return []
    human = plan_mod.human_bytes
    return [recipe.problem(
        "attention.backend", f"{need['attention']}-attention scores at this size take "
        f"{human(need['scores'])} per layer and device ({need['shape']}); twice that "
        f"(scores and softmax) with the weights is about {human(need['bytes'])}, more "
        f"than the {human(memory.bytes)} a device has (set by {memory.source})",
        hint="use attention.backend: blockwise (memory ~ block_q x block_kv) or auto, or "
             "a smaller size; `porter plan` shows the numbers")]


def checkpoint_problems(recipe) -> list[Problem]:
    """A local checkpoint's weight-file headers against its configs (no tensor data
    read; the configs are known to build by now): what `run` checks before loading."""
    if sources.source_kind(recipe.model.source) != "local":
        return []
    from porter.loading import checkpoints
    return [recipe.problem("model.source", problem, hint="re-download that component, "
                           "or re-save the pipeline with save_pretrained")
            for problem in checkpoints.directory_problems(Path(recipe.model.source)
                                                          .expanduser())]


def lora_problems(recipe, registry) -> list[Problem]:
    """Each LoRA adapter read and checked against the model's shapes (built on the
    meta device; no model weights read)."""
    if not recipe.lora:
        return []
    family = registry.family(recipe.model.family)
    modules = abstract.components(family, recipe)
    if modules is None:
        return []  # an unknown hub id: only its files can tell; the run checks
    try:
        lora.read_all(recipe, family.pipeline_class(recipe), modules)
    except RecipeError as exc:
        return exc.problems
    return []


def validate(recipe, registry, devices: int | None = None,
             target=None) -> list[Problem]:
    """Every check that needs no weights; mesh and sharding for ``devices`` devices
    when given (as if: none need exist; of a TPU slice ``target``, a
    ``porter.aot.targets.Target``, with its platform), else for the devices JAX sees."""
    problems = input_problems(recipe, registry)
    if problems:
        return problems  # shape checks need a sound recipe and build the same model
    problems = checkpoint_problems(recipe) or lora_problems(recipe, registry)
    if problems:
        return problems
    if target is not None:
        devices = target.chips
    problems = mesh_problems(recipe, devices, target and target.platform,
                             target and target.name)
    return problems or shape_problems(recipe, registry, devices) + path_write_problems(recipe)


def path_write_problems(recipe) -> list[Problem]:
    """Where the run will write, checked writable now (a run finds out before loading
    anything, `validate` before the run). The compile cache is optional, as in a run:
    an unwritable one is a warning."""
    from porter.runtime import notices
    from porter import runtime
    from porter.runtime import atomic
    from porter.rundir.outputs import output_dir

    problems = []
    why = atomic.writable_problem(output_dir(recipe))
    if why:
        problems.append(recipe.problem("output.dir", f"cannot write the output directory: "
                                       f"{why}", hint="choose a directory you can write "
                                       "(output.dir=...)"))
    cache = runtime.cache_dir(recipe.runtime.compile_cache)
    why = atomic.writable_problem(cache) if cache is not None else None
    if why:
        notices.warn(f"the compile cache cannot be written: {why}; a run goes on without "
                     "it (every run compiles from scratch)", hint="set "
                     "runtime.compile_cache (or PORTER_CACHE_DIR) to a writable directory, "
                     "or false")
    return problems


def checked_family(recipe, registry):
    """Set up JAX's platform and devices (before JAX starts), run `validate`'s checks
    of the recipe and the model's configuration (``input_problems``), and return the
    recipe's family; RecipeError lists every problem."""
    from porter import runtime
    from porter.errors import RecipeError

    runtime.configure(recipe.runtime.platform, recipe.runtime.cpu_devices)
    problems = input_problems(recipe, registry)
    if problems:
        raise RecipeError(problems)
    return registry.family(recipe.model.family)
