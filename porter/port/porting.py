"""What the port's passes (``porter.port.passes``) decide by: which patches a run applies,
which components run on one device or compile in pieces, the stored traces they
reuse, weights refused as non-finite, and the attention backend around each call."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from porter import stepcache as cache
from porter.runtime import distributed
from porter.shims import lowerings
from porter.transforms import patches
from porter.rundir import record
from porter.errors import LoadError
from porter.transforms import attention


@dataclass
class Ported:
    """A built port's records: what ``porter.port.passes`` leaves for the run."""

    traces: object  # the TraceCache used (None when the compile cache is off)
    weights: dict  # component -> where its weights came from and what each device holds
    splits: dict  # component -> autosplit.Split: what could not be compiled whole
    caching: object = None  # porter.stepcache.session.Caching, with a ``cache:`` section


def piece_components(recipe, modules: dict) -> list[str]:
    """The components a ``cache:`` section's method works on: the transformers with a
    block list, each compiled in pieces (none for the guidance cache, which skips whole
    calls)."""
    chosen = cache.settings(recipe)
    if chosen is None or chosen.method == "guidance":
        return []
    return [name for name, module in modules.items()
            if name.startswith("transformer") and cache.block_lists(module)]


def cache_fit_problems(recipe, family, modules: dict) -> list:
    """Can the ``cache:`` section's method work on these modules (their structure
    only, before any weight moves)?"""
    from porter.stepcache import hooks

    chosen = cache.settings(recipe)
    if chosen is None or chosen.method == "guidance":
        return []
    names = piece_components(recipe, modules)
    if not names:
        return [recipe.problem("cache.method", f"{chosen.method} works on a transformer's "
                               "block list; this pipeline's transformer has none",
                               hint="leave the cache section out for this model")]
    unstepped = [name for name in names if name not in family.stepped_transformers]
    if unstepped:
        return [recipe.problem("cache.method", f"family {family.name!r} does not say which "
                               f"steps {', '.join(unstepped)} runs", hint="a plugin's "
                               "transformer_steps and stepped_transformers say it")]
    for name in names:
        try:
            hooks.check(modules[name], chosen)
        except hooks.Misfit as exc:
            return [recipe.problem(f"cache.{exc.key}", f"{name}: {exc}", hint=exc.hint)]
    return []


def refuse_nonfinite(found: dict, recipe) -> None:
    """NaN or infinity in the weights (``found``: tensor -> count, this process's rows)
    is an error on every process, decided together so that none runs on alone."""
    from porter.runtime import notices

    if not distributed.anywhere(bool(found)):
        return
    shown = ", ".join(f"{name} ({count})" for name, count in list(found.items())[:6])
    more = f" and {len(found) - 6} more" if len(found) > 6 else ""
    what = (f"NaN or infinite values in {len(found)} weight tensor(s): {shown}{more}"
            if found else "NaN or infinite values in weights another process read")
    if recipe.model.allow_nonfinite:
        notices.warn(what + " (allowed by model.allow_nonfinite)")
        return
    # an adapter's own values were checked when it was read (finite): fused, its update
    # can still overflow the weights' dtype
    fused = "".join(f"; or LoRA adapter lora.{i}.file ({spec.file}) at scale {spec.scale} "
                    "overflows them when fused: try a lower scale"
                    for i, spec in enumerate(recipe.lora))
    raise LoadError(what, hint="the checkpoint is damaged, was saved from a diverged model, "
                    "or holds values too large for model.dtype (float16 ends at 65504); "
                    "re-download or re-save it, or use a wider dtype (model.allow_nonfinite:"
                    f" true loads it anyway){fused}")


#: recipe keys that never reach a traced program: what a video is made from (its
#: values enter as inputs, their shapes are in every trace key anyway) and where
#: the results go. Changing them keeps the stored traces.
NOT_TRACED = ("output", "verify", "generate.prompt", "generate.negative_prompt",
              "generate.seed", "generate.image", "generate.last_image", "generate.video",
              "generate.mask", "generate.control_video",
              # fused into the weights before tracing: the programs take weights as inputs
              "lora",
              # decided between programs: a cached transformer's pieces are programs of
              # their own names (transformer.blocks.0.forward, ...), whatever the method
              "cache")


def traced_settings(recipe) -> str:
    """The recipe's settings that a traced program may depend on, as canonical JSON."""
    import json

    data = recipe.resolved()
    for dotted in NOT_TRACED:
        *parents, last = dotted.split(".")
        owner = data
        for parent in parents:
            owner = owner.get(parent) or {}
        owner.pop(last, None)
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def trace_cache(recipe, family, runtime):
    """Traced programs beside the compile cache (none when the cache is off)."""
    import hashlib

    from porter.transforms.compile.traces import TraceCache, code_fingerprint
    if runtime.cache is None:
        return None
    from porter import plugins

    # the code a trace runs: Porter, the family, and whatever plugins patch or attend with
    registry = plugins.registry()
    registry_modules = [type(family).__module__,
                        *(p.replacement.__module__ for p in registry.patches.values()),
                        *(b.kernel.__module__ for b in registry.attention.values())]
    parts = [traced_settings(recipe), repr(record.versions()), repr(runtime.axes),
             code_fingerprint(["porter", *registry_modules])]
    return TraceCache(runtime.cache / "porter-traces",
                      hashlib.sha256("\n".join(parts).encode()).hexdigest())


#: patches every run applies: they make torchax behave as PyTorch does
CORE_PATCHES = ("core.setitem", "core.deepcopy", "core.view_index", "core.type_as",
                "core.block_mask", "core.flex_attention")


def takes_sharded_inputs(name: str, recipe) -> bool:
    """Are the component's inputs placed by the recipe's ``sharding.inputs`` (the
    transformers' are)?"""
    return name.startswith("transformer") and bool(recipe.sharding.inputs)


def runs_on_one_device(name: str, recipe, rule, devices: int, unsharded: bool,
                       in_pieces: bool) -> bool:
    """Does a compiled component run on one device of the mesh: nothing shards it (no
    weight rule, no activation rule, no input sharding), it is compiled whole, and the
    mesh has more than one device?"""
    return unsharded and devices > 1 and rule.modules is None and not in_pieces \
        and not takes_sharded_inputs(name, recipe)


def selected_patches(recipe, registry, family):
    """The recipe's patches, plus the core's (``CORE_PATCHES``), the family's required
    ones and its rotary patch when tables are precomputed."""
    extra = CORE_PATCHES + family.required_patches
    if recipe.rotary.precompute:
        extra += (family.rotary_patch_for(recipe),)
    return patches.selected(recipe, registry, extra)


@contextlib.contextmanager
def ops_installed(recipe, registry, runtime):
    """Porter's lowerings (``porter.shims.lowerings``) and the recipe's attention backend in
    place of torchax's, for the block."""
    with lowerings.installed(runtime.env):
        if recipe.attention.backend is None:
            yield
            return
        undo = attention.install(runtime.env, recipe.attention, registry.attention,
                                 runtime.mesh, runtime.platform)
        try:
            yield
        finally:
            undo()
