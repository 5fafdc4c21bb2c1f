"""``scheduler``: the recipe's scheduler (another class, its settings) and its schedule
(``generate.timesteps`` or ``generate.sigmas``, given one by one); around each call,
the scheduler's tables where the latents are (``tables``).

A step-distilled model (a LoRA or weights trained to finish in four steps) is run with
a scheduler setting, not a kernel: a flow shift, a fixed list of noise levels, one
transformer pass a step. The pass makes the pipeline's scheduler the way diffusers
users make it, ``cls.from_config(pipe.scheduler.config, **scheduler.config)`` (``cls``:
``scheduler.name``, or the pipeline's own class), with every override checked against
the class's settings first: diffusers drops a key it does not know with a warning, and
a misspelt ``shift`` would run the wrong schedule without a word.

A schedule given one by one is set on the scheduler by the core's loop for a staged
family (``timesteps``: Wan's pipelines take neither argument, so the loop owns this),
and goes to a generic pipeline's call where that takes it; either way the scheduler's
``set_timesteps`` must take it, which is checked before anything runs.
"""

from __future__ import annotations

import inspect
import json
from typing import TYPE_CHECKING

from porter.errors import RecipeError, first_line
from porter.families.staged import from_the_start
from porter.recipe import SCHEDULE_KEYS, call_args, sources
from porter.shims.interop import to_host
from porter.transforms import CALL, Calling, Checking, Pass
from porter.transforms.scheduler import tables

if TYPE_CHECKING:
    from porter.errors import Problem
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe
    from porter.transforms.building import Building

def given(gen) -> dict[str, list[float]]:
    """The schedule the generate settings give one step at a time (may be empty)."""
    return {key: list(getattr(gen, key)) for key in SCHEDULE_KEYS
            if getattr(gen, key) is not None}


def scheduler_names() -> list[str]:
    """The scheduler classes of the installed diffusers, by name (none imported)."""
    import diffusers

    return sorted(n for n in dir(diffusers) if n.endswith("Scheduler") and n[0].isupper())


def scheduler_class(name: str) -> type:
    """The diffusers scheduler class ``name`` (ValueError: not one; ImportError: one
    that needs a library this machine lacks)."""
    import diffusers
    from diffusers import SchedulerMixin

    if name not in scheduler_names():
        raise ValueError(name)
    cls = getattr(diffusers, name)
    if type(cls).__name__ == "DummyObject":  # diffusers' stand-in: a library is missing
        raise ImportError(f"{name} needs {', '.join(getattr(cls, '_backends', []))}")
    if not (isinstance(cls, type) and issubclass(cls, SchedulerMixin)):
        raise ValueError(name)
    return cls


def settings_of(cls) -> list[str]:
    """The configuration keys ``cls`` takes (its constructor's arguments)."""
    return [name for name, p in inspect.signature(cls.__init__).parameters.items()
            if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def checkpoint_class(recipe: Recipe) -> str | None:
    """The scheduler class a local checkpoint's configuration names (None: a tiny
    model or a hub id, whose scheduler is known once the pipeline is loaded)."""
    from pathlib import Path

    if sources.source_kind(recipe.model.source) != "local":
        return None
    try:
        config = json.loads((Path(recipe.model.source).expanduser() / "scheduler" /
                             "scheduler_config.json").read_text())
        return config["_class_name"] if isinstance(config, dict) else None
    except (OSError, ValueError, KeyError):
        return None  # the load pass says what is wrong with the checkpoint


def class_problems(recipe: Recipe) -> tuple[type | None, list]:
    """The class the run will have (``scheduler.name``'s, else a local checkpoint's;
    None: known only once loaded, or unknown) and what is wrong with the section: an
    unknown class, settings it does not take."""
    import difflib

    name = recipe.scheduler.name
    if name is None:
        own = checkpoint_class(recipe)
        try:
            cls = scheduler_class(own) if own else None
        except (ValueError, ImportError):
            cls = None  # not a scheduler Porter can check by name: the load pass does
        return cls, config_problems(recipe, cls) if cls is not None else []
    try:
        cls = scheduler_class(name)
    except ValueError:
        close = difflib.get_close_matches(name, scheduler_names(), n=1)
        return None, [recipe.problem("scheduler.name", f"{name!r} is not a scheduler of "
                                     "the installed diffusers",
                                     hint=f"did you mean {close[0]!r}?" if close else
                                     "e.g. FlowMatchEulerDiscreteScheduler, "
                                     "UniPCMultistepScheduler")]
    except ImportError as exc:
        return None, [recipe.problem("scheduler.name", f"{name} needs a library this "
                                     f"machine lacks: {first_line(exc)}",
                                     hint="install it, or choose another scheduler")]
    return cls, config_problems(recipe, cls)


def config_problems(recipe: Recipe, cls) -> list:
    """Overrides the class has no setting for, each with the closest one."""
    import difflib

    known = settings_of(cls)
    found = []
    for key in recipe.scheduler.config:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            found.append(recipe.problem(
                f"scheduler.config.{key}", f"{cls.__name__} has no setting {key!r}",
                hint=f"did you mean {close[0]!r}?" if close else
                f"its settings: {', '.join(known)}"))
    return found


def schedule_problems(recipe: Recipe, cls) -> list:
    """A schedule the class's ``set_timesteps`` cannot take, or whose count disagrees
    with ``generate.steps`` (``cls`` None: only the count is checked)."""
    gen, values = recipe.generate, given(recipe.generate)
    found = []
    if len({len(v) for v in values.values()}) > 1:
        found.append(recipe.problem("generate.sigmas", f"{len(gen.sigmas)} sigmas for "
                                    f"{len(gen.timesteps)} timesteps",
                                    hint="give one of each per step"))
    for key, value in values.items():
        if gen.steps is not None and gen.steps != len(value):
            found.append(recipe.problem("generate.steps", f"{gen.steps} steps, but "
                                        f"generate.{key} gives {len(value)}",
                                        hint=f"set generate.steps: {len(value)}, or null "
                                        "(the schedule then counts its steps)"))
    if cls is None:
        return found
    taken = inspect.signature(cls.set_timesteps).parameters
    for key in values:
        if key not in taken:
            takers = ", ".join(_takers(key))
            found.append(recipe.problem(
                f"generate.{key}", f"{cls.__name__} cannot be given its {key} (its "
                f"set_timesteps takes no {key} argument)",
                hint=f"set scheduler.name to a scheduler that can: {takers}"))
    return found


def _takers(key: str) -> list[str]:
    """Scheduler classes whose ``set_timesteps`` takes ``key`` (imports each: only for
    a message)."""
    found = []
    for name in scheduler_names():
        try:
            cls = scheduler_class(name)
        except (ValueError, ImportError):
            continue
        if key in inspect.signature(cls.set_timesteps).parameters:
            found.append(name)
    return found


def configured(scheduler, recipe: Recipe):
    """``scheduler`` as the recipe's ``scheduler`` section makes it (itself when the
    section is empty); RecipeError for a class or a setting that does not fit."""
    section = recipe.scheduler
    if section.name is None and not section.config:
        return scheduler
    cls, problems = class_problems(recipe)
    if cls is None and not problems:
        cls = type(scheduler)
        problems = config_problems(recipe, cls)
    if problems:
        raise RecipeError(problems)
    try:
        return cls.from_config(scheduler.config, **section.config)
    except Exception as exc:  # a value the class refuses: its message says which
        raise RecipeError([recipe.problem("scheduler.config", f"{cls.__name__} refuses "
                                          f"these settings: {first_line(exc)}")]) from None


def set_schedule(scheduler, recipe: Recipe, device):
    """Set the recipe's schedule (``given``) on ``scheduler``, starting at its first
    entry (``from_the_start``); returns its timesteps."""
    problems = schedule_problems(recipe, type(scheduler))
    if problems:
        raise RecipeError(problems)
    scheduler.set_timesteps(device=device, **given(recipe.generate))
    from_the_start(scheduler)
    return scheduler.timesteps


def timesteps(family: ModelFamily, pipe, recipe: Recipe):
    """The staged loop's timesteps: the recipe's schedule set on the pipeline's
    scheduler, or the family's own (``StagedFamily.timesteps``)."""
    if given(recipe.generate):
        return set_schedule(pipe.scheduler, recipe, "jax")
    return family.timesteps(pipe, recipe)


def planned(scheduler, recipe: Recipe) -> list[float]:
    """The timesteps a run of ``recipe`` takes with a scheduler like ``scheduler``
    (a copy, on the host): the recipe's schedule, or ``generate.steps`` evenly spread."""
    copy = configured(type(scheduler).from_config(scheduler.config), recipe)
    if given(recipe.generate):
        set_schedule(copy, recipe, "cpu")
    else:
        copy.set_timesteps(recipe.generate.steps, device="cpu")
    return [float(t) for t in copy.timesteps]


def describe(scheduler, steps) -> dict:
    """What decides a run's schedule: the scheduler's class, its configuration and the
    timesteps it runs (``steps``), as JSON (run records, stages and checkpoints)."""
    values = to_host(steps) if hasattr(steps, "jax") else steps
    # its public settings: diffusers' private keys (``_use_default_values``, a list in
    # the order of a set) differ between processes for one configuration
    public = {k: v for k, v in scheduler.config.items() if not k.startswith("_")}
    config = json.loads(json.dumps(public, default=str))
    return {"class": type(scheduler).__name__, "config": config,
            "timesteps": [round(float(t), 6) for t in values]}


def differences(saved: dict, now: dict) -> list[str]:
    """How two ``describe`` results differ, a phrase each."""
    found = []
    if saved.get("class") != now["class"]:
        found.append(f"class {saved.get('class')} -> {now['class']}")
    then_config = saved.get("config") if isinstance(saved.get("config"), dict) else {}
    for key in sorted(set(then_config) | set(now["config"])):
        if then_config.get(key) != now["config"].get(key):
            found.append(f"config.{key} {then_config.get(key)!r} -> {now['config'].get(key)!r}")
    if saved.get("timesteps") != now["timesteps"]:
        found.append(f"timesteps {saved.get('timesteps')} -> {now['timesteps']}")
    return found


def _check(c: Checking) -> list[Problem]:
    cls, problems = class_problems(c.recipe)
    return problems + schedule_problems(c.recipe, cls)


def _apply(b: Building) -> None:
    """The pipeline's scheduler as the recipe sets it; its schedule checked against the
    class it now has (a generic pipeline's call hands it to the scheduler as well)."""
    scheduler = getattr(b.pipe, "scheduler", None)
    if scheduler is None:
        section = b.recipe.scheduler
        taken = call_args.parameters(type(b.pipe)) or {}
        # a call that takes the schedule itself (Echo steps through its own sigmas)
        unused = [key for key in given(b.recipe.generate) if key not in taken]
        if section.name or section.config or unused:
            raise RecipeError([b.recipe.problem(
                "scheduler" if section.name or section.config else "generate",
                f"{type(b.pipe).__name__} has no scheduler to set",
                hint="leave the scheduler section and generate.timesteps/sigmas out")])
        return
    b.pipe.scheduler = configured(scheduler, b.recipe)
    problems = schedule_problems(b.recipe, type(b.pipe.scheduler))
    if problems:
        raise RecipeError(problems)
    if b.pipe.scheduler is not scheduler:
        b.say(f"scheduler: {detail(b.recipe)}")


def detail(recipe: Recipe) -> str | None:
    """The recipe's scheduler and schedule, in a few words (None: the pipeline's own)."""
    section, parts = recipe.scheduler, []
    if section.name or section.config:
        settings = ", ".join(f"{k} {v}" for k, v in section.config.items())
        parts.append((section.name or "the pipeline's class")
                     + (f" ({settings})" if settings else ""))
    parts += [f"{key} {value}" for key, value in given(recipe.generate).items()]
    return "; ".join(parts) or None


def _detail(c: Checking) -> str:
    return detail(c.recipe) or "the pipeline's own, its schedule checked"


def _around(c: Calling):
    if c.scope != CALL or c.pipe is None:
        return None
    return tables.on_device(getattr(c.pipe, "scheduler", None), c.runtime)


PASS = Pass(
    "scheduler", ("scheduler", "generate"), "make the scheduler the recipe names, with its "
    "settings, and check the schedule it is given",
    each_call="the scheduler's tables moved onto the mesh as its methods meet the "
    "latents", check=_check, apply=_apply, detail=_detail, around=_around)
