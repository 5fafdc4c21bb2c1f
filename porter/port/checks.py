"""The checks that need no weights, each finding every problem at once: of the recipe
(``recipe_problems``), of the model its configuration builds (``model_problems``), of
the mesh and the sharding rules against the model's shapes (``shape_problems``), of a
checkpoint's files and LoRA adapters. ``porter validate`` runs them all; every command
that loads a model runs the first two before it loads (``checked_family``), and a
port's calls check their changed settings (``with_settings``)."""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import TYPE_CHECKING

from porter import loading
from porter import recipe as recipe_mod
from porter.errors import Problem, RecipeError, UsageError
from porter.loading import abstract, checkpoints, config_values
from porter.port import estimates, passes
from porter.recipe import sources
from porter.recipe.inputs import INPUTS
from porter.runtime import configure, memory, resolve_mesh
from porter.transforms import Checking, attention, lora, quantize
from porter.transforms.attention import backends
from porter.transforms.sharding import human_bytes

if TYPE_CHECKING:
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe
    from porter.registry import Registry
    from porter.runtime import Runtime

# Building a model on the meta device takes no memory, but time grows with its
# size: num_layers: 1000000 would build for hours. Torch calls per build, by
# source: a tiny model with model.config (a 14B-shaped Wan takes ~6k; this is
# about 370 blocks), a local checkpoint (Wan 2.2 A14B, two experts, takes 25k).
MAX_BUILD_CALLS = {"tiny": 50_000, "local": 250_000}


def family_problems(recipe: Recipe, registry: Registry) -> list[Problem]:
    name = recipe.model.family
    if name in registry.families:
        return []
    close = difflib.get_close_matches(name, list(registry.families), n=1)
    known = ", ".join(sorted(registry.families)) or "none"
    hint = f"did you mean {close[0]!r}?" if close else f"registered families: {known}"
    return [recipe.problem("model.family", f"unknown model family {name!r}", hint=hint)]


def _path_problem(recipe: Recipe, key: str, value: str, from_recipe: bool) -> list[Problem]:
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


def path_problems(recipe: Recipe) -> list[Problem]:
    """Paths the system refuses even to look at. The other checks ask whether these
    paths exist, and for such a path that question raises instead of answering."""
    problems = []
    if recipe.model.source != sources.TINY:
        problems += _path_problem(recipe, "model.source", recipe.model.source, False)
    for name in loading.single_file.COMPONENTS:  # a file of its own
        if getattr(recipe.model, name):
            problems += _path_problem(recipe, f"model.{name}", getattr(recipe.model, name),
                                      False)
    for key in INPUTS:
        if getattr(recipe.generate, key):
            problems += _path_problem(recipe, f"generate.{key}",
                                      getattr(recipe.generate, key), True)
    return problems


def required_problems(recipe: Recipe, family: ModelFamily) -> list[Problem]:
    """generate settings the family needs that the recipe leaves out (its other checks
    read them)."""
    return [recipe.problem(f"generate.{key}", f"family {family.name!r} needs "
                           f"generate.{key}", hint=f"set generate.{key}")
            for key in family.required if getattr(recipe.generate, key) is None]


def recipe_problems(recipe: Recipe, registry: Registry) -> list[Problem]:
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
        problems += preview_problems(recipe, family)
    return problems + passes.check_problems(Checking(recipe, registry, family))


def preview_problems(recipe: Recipe, family: ModelFamily) -> list[Problem]:
    """``output.preview_every`` for a family that makes no live previews."""
    if not recipe.output.preview_every or family.previews:
        return []
    return [recipe.problem("output.preview_every", f"family {family.name!r} makes no live "
                           "previews (its latents or its decode take another layout, or "
                           "the pipeline runs its own loop)",
                           hint="leave output.preview_every at 0")]


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


def model_problems(recipe: Recipe, registry: Registry) -> list[Problem]:
    """Build the model on the meta device, as the shape checks will, and turn a failure
    into a problem: model.config goes verbatim to the family's constructor, and a local
    checkpoint's model_index.json and config.json files are input as much as the recipe."""
    kind = sources.source_kind(recipe.model.source)
    if kind == "tiny" and recipe.model.config:
        key, what = "model.config", "this configuration"
    elif kind == "local":
        key, what = "model.source", "the configuration files in this checkpoint"
        folder = Path(recipe.model.source).expanduser()
        missing = checkpoints.configuration_problems(folder)
        if missing:  # each file named, before a constructor's or loader's own words
            return [recipe.problem(key, problem, hint="is it a complete diffusers "
                                   "directory, as save_pretrained writes it? re-download "
                                   "it, or re-save the pipeline") for problem in missing]
        try:
            values = config_values.problems(folder)
        except Exception:  # noqa: BLE001 - an unreadable index: the build below says why
            values = []
        if values:
            return [recipe.problem(key, problem, hint="the checkpoint's configuration is "
                                   "damaged: re-download it, or re-save the pipeline with "
                                   "save_pretrained") for problem in values]
    else:
        return []
    family = registry.family(recipe.model.family)
    try:
        built = abstract.sketches(family, recipe,
                                  guard=lambda: _call_budget(MAX_BUILD_CALLS[kind]))
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


def tiny_config_problems(recipe: Recipe, built: dict) -> list[Problem]:
    """``model.config`` values the transformer builds from but cannot be right, judged
    as a checkpoint's config.json is (``num_layers: -3`` builds a model of no blocks);
    ``built``: the components' sketches."""
    transformer = (built or {}).get("transformer")
    if transformer is None:
        return []
    return [recipe.problem(f"model.config.{key}", why, hint="check the values' types "
                           "and sizes") for key, why in config_values.value_problems(
                               dict(recipe.model.config), transformer.defaults)]


def input_problems(recipe: Recipe, registry: Registry) -> list[Problem]:
    """The recipe, then the model it names built from its configuration (a tiny
    model's ``model.config``, a local checkpoint's config files) on the meta device:
    what `validate` checks first and what every command that loads a model checks
    before loading, so that both refuse the same input with the same message."""
    return recipe_problems(recipe, registry) or model_problems(recipe, registry)


def mesh_problems(recipe: Recipe, registry: Registry, devices: int | None = None,
                  platform: str | None = None, target: str | None = None) -> list[Problem]:
    """Does the mesh fit the devices JAX sees (imports JAX), or ``devices`` devices
    (checked as if: no JAX devices needed, nor the platform, unless the recipe names
    it or ``platform`` is given)? And does the attention backend run on the platform?"""
    if devices is None:
        configure(recipe.runtime.platform, recipe.runtime.cpu_devices)
        import jax
        count, platform = jax.device_count(), jax.default_backend()
    else:
        count, platform = devices, platform or recipe.runtime.platform
    try:
        resolve_mesh(recipe.mesh, count, given=devices is not None, target=target)
    except UsageError as exc:
        return [recipe.problem("mesh", exc.message, hint=exc.hint)]
    if platform == "auto":
        return []  # where it will run is not known: `run` checks the backend there
    return attention.platform_problems(recipe, registry, platform)


def shape_problems(recipe: Recipe, registry: Registry,
                   devices: int | None = None, skipped: list | None = None) -> list[Problem]:
    """Every pass's ``fit`` against the model's shapes (meta device, no weights), for
    the devices JAX sees or ``devices`` devices; with the devices JAX sees, also the
    memory one layer's attention needs against what a device has. ``skipped`` is told
    what could not be checked, and why."""
    family = registry.family(recipe.model.family)
    modules = abstract.sketches(family, recipe)
    if modules is None:  # no configuration to check against (a hub id, offline)
        if skipped is not None:
            skipped.append(f"shapes and sharding rules not checked: no configuration of "
                           f"{recipe.model.source} here (download it, or point "
                           "model.source at a saved pipeline)")
        return []
    try:
        axes = resolve_mesh(recipe.mesh, estimates.device_count(recipe, devices),
                            given=devices is not None)
    except UsageError:
        return []  # ``mesh_problems`` says why
    problems = passes.fit_problems(Checking(recipe, registry, family, modules, axes))
    if devices is None:  # the weights' bytes as placed
        problems += memory_problems(recipe, registry, family,
                                    quantize.sketched(recipe, family, modules), axes)
    return problems


def memory_problems(recipe: Recipe, registry: Registry, family: ModelFamily, modules: dict,
                    axes: dict) -> list[Problem]:
    """Attention scores that cannot fit beside the weights on a device, with a backend
    that materialises them all (torchax's default, ``reference``)."""
    section = recipe.attention
    if not any(backends.materialises(name, registry.attention)
               for name in (section.backend, section.cross_backend or section.backend)):
        return []
    weights = sum(c["bytes_per_device"] for c in estimates.weights(recipe, modules, axes))
    need = estimates.attention_need(recipe, registry, weights,
                                    estimates.step_costs(recipe, family, modules, axes))
    limit = memory.device_memory(math.prod(axes.values()))
    if limit is None or need is None or not need["materialised"] \
            or need["bytes"] <= limit.bytes:
        return []
    return [recipe.problem(
        "attention.backend", f"{need['attention']}-attention scores at this size take "
        f"{human_bytes(need['scores'])} per layer and device ({need['shape']}); twice that "
        f"(scores and softmax) with the weights is about {human_bytes(need['bytes'])}, more "
        f"than the {human_bytes(limit.bytes)} a device has (set by {limit.source})",
        hint="use attention.backend: blockwise (memory ~ block_q x block_kv) or auto, or "
             "a smaller size; `porter plan` shows the numbers")]


#: memory a check of what is free now leaves to the rest of a call: activations,
#: compiled programs and temporaries the estimate does not count, and what other
#: processes take meanwhile
FREE_MARGIN = 2**30


def headroom_problems(recipe: Recipe, registry: Registry,
                      asked: tuple[str, ...] = ()) -> list[Problem]:
    """A call of ``recipe`` on a port already loaded (a server's job, when it is
    submitted and again when it starts): what its largest attention takes per device,
    beyond the weights the port already holds, against what a device can still take
    now (other processes' use counted: ``memory.device_free``) less ``FREE_MARGIN``.
    ``memory_problems`` holds the whole call to what a device has at all; this one
    holds the growth to what is free. ``asked``: the ``generate`` keys the call set
    (its problem is located at the first of its sizes)."""
    family = registry.family(recipe.model.family)
    modules = abstract.sketches(family, recipe)
    if modules is None:
        return []
    axes = resolve_mesh(recipe.mesh, estimates.device_count(recipe, None))
    need = estimates.attention_need(recipe, registry, 0,
                                    estimates.step_costs(recipe, family, modules, axes))
    free = memory.device_free(math.prod(axes.values()))
    if need is None or free is None or need["bytes"] + FREE_MARGIN <= free.bytes:
        return []
    kept = " (scores and softmax)" if need["materialised"] else ""
    sizes = [key for key in ("frames", "height", "width") if key in asked] or ["frames"]
    return [recipe.problem(
        f"generate.{sizes[0]}",
        f"not enough memory free now: {need['attention']}-attention at this size takes "
        f"about {human_bytes(need['bytes'])} per device{kept} beyond the loaded weights, "
        f"and a device can take {human_bytes(max(0, free.bytes))} now (set by "
        f"{free.source}; {human_bytes(FREE_MARGIN)} is left for the rest of the call)",
        hint="a smaller size (generate.height, width, frames), or again when other "
             "processes have freed memory")]


def checkpoint_problems(recipe: Recipe) -> list[Problem]:
    """A local checkpoint's weight-file headers against its configs (no tensor data
    read; the configs are known to build by now): what `run` checks before loading."""
    if sources.source_kind(recipe.model.source) != "local":
        return []
    return [recipe.problem("model.source", problem, hint="re-download that component, "
                           "or re-save the pipeline with save_pretrained")
            for problem in checkpoints.directory_problems(
                Path(recipe.model.source).expanduser(), loading.elsewhere_components(recipe))]


def lora_problems(recipe: Recipe, registry: Registry) -> list[Problem]:
    """Each LoRA adapter read and checked against the model's shapes (built on the
    meta device; no model weights read); a hub file not yet in the local cache is
    fetched and checked by the run."""
    if not recipe.lora:
        return []
    family = registry.family(recipe.model.family)
    modules = abstract.components(family, recipe)
    if modules is None:
        return []  # an unknown hub id: only its files can tell; the run checks
    try:
        lora.read_all(recipe, family.pipeline_class(recipe), modules, fetch=False)
    except RecipeError as exc:
        return exc.problems
    return []


def runtime_problems(recipe: Recipe, registry: Registry, runtime: Runtime) -> list[Problem]:
    """The recipe's attention backends that cannot run on the platform JAX started on,
    or on its devices (``validate`` checks the platform only where the recipe names
    it, and no device)."""
    return attention.platform_problems(recipe, registry, runtime.platform,
                                       runtime.mesh.devices.flat[0])


def check_platform(recipe: Recipe, registry: Registry, runtime: Runtime) -> None:
    """RecipeError for ``runtime_problems``."""
    problems = runtime_problems(recipe, registry, runtime)
    if problems:
        raise RecipeError(problems)


def checked_family(recipe: Recipe, registry: Registry):
    """Set up JAX's platform and devices (before JAX starts), run `validate`'s checks
    of the recipe and the model's configuration (``input_problems``), and return the
    recipe's family; RecipeError lists every problem."""
    configure(recipe.runtime.platform, recipe.runtime.cpu_devices)
    problems = input_problems(recipe, registry)
    if problems:
        raise RecipeError(problems)
    return registry.family(recipe.model.family)


#: where per-call settings come from in error messages, by default (not a file: relative
#: paths in them start from the current directory)
CALL = "Port.generate"
#: generate settings that decide tensor shapes (checked against the model when changed)
SHAPE_KEYS = ("height", "width", "frames", *INPUTS, "max_sequence_length", "cfg_parallel",
              "guidance_scale")


def with_settings(recipe: Recipe, registry: Registry, values: dict, source: str = CALL,
                  line: int | None = None):
    """``recipe`` with ``generate`` settings changed, checked as ``porter validate``
    checks them, without weights (``RecipeError``, every problem); ``source`` and
    ``line`` name where the values came from in messages. Relative image paths start
    from that file's folder when there is a line, else from the current directory."""
    values = {k: _plain(v) for k, v in values.items()}
    if line is None:
        values.update({k: str(Path(values[k]).expanduser().absolute())
                       for k in INPUTS if isinstance(values.get(k), str)})
    changed = recipe_mod.with_values(recipe, "generate", values, source, line)
    problems = recipe_problems(changed, registry) or _pipeline_problems(
        recipe, changed, registry)
    if not problems and any(getattr(recipe.generate, key) != getattr(changed.generate, key)
                            for key in SHAPE_KEYS):
        problems = shape_problems(changed, registry)
    if problems:
        raise RecipeError(problems)
    return changed


def _plain(value):
    """A setting as the schema reads it: a path as its text, a NumPy scalar (a seed from
    ``np.arange``) as the Python number it is; nothing else converted (64.0 for a
    height stays a float the schema refuses)."""
    import numpy as np

    if isinstance(value, Path):
        return str(value)
    return value.item() if isinstance(value, np.generic) else value


def _pipeline_problems(recipe: Recipe, changed, registry: Registry) -> list:
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
