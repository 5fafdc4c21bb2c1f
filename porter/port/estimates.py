"""What a port will hold and compute on each device, from shapes alone (no weights, no
devices): where every weight goes, FLOPs and attention memory per step. ``porter plan``
prints it; ``validate`` and out-of-memory messages compare it with a device's memory."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from porter.errors import RecipeError, UsageError
from porter.loading import abstract
from porter.port import passes
from porter.runtime import configure, resolve_mesh
from porter.transforms import Checking, quantize, sharding
from porter.transforms.attention import backends, sharded
from porter.transforms.attention.window import Tiling, exchange

if TYPE_CHECKING:
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe
    from porter.registry import Registry


def device_count(recipe: Recipe, devices: int | None) -> int:
    """``devices``, or the devices JAX sees (it starts here, as the recipe asks)."""
    if devices is not None:
        return devices
    configure(recipe.runtime.platform, recipe.runtime.cpu_devices)
    import jax
    return jax.device_count()


def weights(recipe: Recipe, modules: dict, axes: dict[str, int]) -> list[dict]:
    """``component_plan`` of every component, by the recipe's weight rules."""
    return [component_plan(name, module, recipe.sharding.weights.get(name, []), axes)
            for name, module in modules.items()]


def component_plan(name: str, module, rules, axes: dict[str, int]) -> dict:
    """Where each of a component's tensors (``module``: its sketch) goes by ``rules``."""
    assignments = sharding.assign(module.tensors.items(), rules)
    rows = []
    for index, rule in enumerate(rules):
        hits = [a for a in assignments if a.rule == index]
        rows.append({"rule": rule.match, "spec": list(sharding.normalize(rule.spec)),
                     "tensors": len(hits), "bytes": sum(a.nbytes for a in hits),
                     "bytes_per_device": sum(a.bytes_per_device(axes) for a in hits)})
    rest = [a for a in assignments if a.rule is None]
    rows.append({"rule": None, "spec": [], "tensors": len(rest),
                 "bytes": sum(a.nbytes for a in rest),
                 "bytes_per_device": sum(a.nbytes for a in rest)})
    per_device = sum(a.bytes_per_device(axes) for a in assignments)
    replicated = sum(a.nbytes for a in assignments if a.split(axes) == 1)
    return {"component": name, "tensors": len(assignments),
            "bytes": sum(a.nbytes for a in assignments), "bytes_per_device": per_device,
            "replicated_bytes_per_device": replicated,
            "sharded_bytes_per_device": per_device - replicated,
            "rules": rows}


def build(recipe: Recipe, registry: Registry, devices: int | None = None,
          target=None) -> dict:
    """Where every weight goes for ``devices`` devices (default: the devices JAX sees);
    with a ``target`` (porter.aot.targets.Target), also against its chips' memory."""
    family = registry.family(recipe.model.family)
    modules = abstract.sketches(family, recipe)
    if modules is None:
        raise UsageError(f"cannot plan {recipe.model.source!r} without its configuration",
                         hint="point model.source at a local diffusers directory")
    try:
        axes = resolve_mesh(recipe.mesh, device_count(recipe, devices),
                            given=devices is not None)
    except UsageError as exc:  # said at the recipe's mesh, as validate says it
        raise RecipeError([recipe.problem("mesh", exc.message, hint=exc.hint)]) from None
    problems = passes.fit_problems(Checking(recipe, registry, family, modules, axes))
    details = passes.details(Checking(recipe, registry, family, modules, axes))
    modules = quantize.sketched(recipe, family, modules)  # as placed: 8-bit where asked
    components = weights(recipe, modules, axes)
    found = {"recipe": recipe.name, "mesh": axes, "devices": math.prod(axes.values()),
             "components": components,
             "weights_bytes_per_device": sum(c["bytes_per_device"] for c in components),
             "estimates": step_costs(recipe, family, modules, axes),
             "passes": details, "problems": problems}
    if target is not None:
        problems += quantize.chip_problems(recipe, target.platform, target.facts.name)
        found["target"] = {"name": target.name, "chip": target.facts.name,
                           "usable_hbm_bytes": target.facts.usable_hbm_bytes}
    return found


def step_costs(recipe: Recipe, family: ModelFamily, modules: dict, axes: dict[str,
               int]) -> dict:
    """``costs`` of one denoising step, from the family's estimates for the transformer
    (none for a pipeline without one, or a family that does not say)."""
    transformer = modules.get("transformer")
    if transformer is None:
        return {}
    raw = family.estimates(recipe, transformer.config)
    if raw and recipe.attention.window is not None:  # the window's tiles decide its moves
        raw = {**raw, "grid": family.token_grid(recipe)}
    return costs(recipe, raw, axes)


def costs(recipe: Recipe, raw: dict, axes: dict[str, int]) -> dict:
    """Per-device FLOPs and attention memory, reference vs blockwise, for one step."""
    if not raw:
        return {}
    devices = math.prod(axes.values())
    section = recipe.attention
    # tokens over sp and ring: the heads over sp (``sharding.sequence_split``,
    # ``AttentionSettings``)
    sequence = sharding.token_axes(axes)
    head_axis = sharding.head_axis(section, axes)
    split = {a: axes.get(a, 1) for a in (section.data_axis, head_axis) if a}
    tokens_cut = math.prod(axes[axis] for axis in sequence)
    out = {"tokens": raw["tokens"], "flops_per_step": raw["flops_per_step"],
           "flops_per_step_per_device": raw["flops_per_step"] // devices, "attention": {},
           "activations": {}}
    itemsize = 2 if recipe.model.dtype != "float32" else 4
    data = split.get(section.data_axis, 1)
    for name, (batch, tokens, width) in raw.get("activations", {}).items():
        local_batch = batch // data if batch % data == 0 else batch
        # the tokens over sp split both; else the hidden states are whole on each
        # device (split along the width between a Wan block's updates, but gathered
        # whole into each matmul) and the FFN middle is split by the head axis
        cut = tokens_cut if name == "hidden" or sequence else split.get(head_axis, 1)
        out["activations"][name] = {"shape": [batch, tokens, width],
                                    "bytes_per_device": local_batch * tokens * width
                                    * itemsize // cut}
    ring = axes.get(sharding.RING_AXIS, 1)
    for name, (batch, heads, q_len, k_len) in raw["attention"].items():
        # batch over the data axis, heads (or queries) over the head axis, the queries
        # over the ring's axis too
        local_batch = batch // split.get(section.data_axis, 1) if batch % split.get(
            section.data_axis, 1) == 0 else batch
        local = local_batch * heads / split.get(head_axis, 1) / ring
        block = min(section.block_q, q_len) * min(section.block_kv, k_len)
        out["attention"][name] = {
            "shape": [batch, heads, q_len, k_len],
            "reference_bytes_per_device": int(local * q_len * k_len * 4),
            "blockwise_bytes_per_device": int(local * block * 4)}
    if sequence and "self" in raw["attention"] and "hidden" in raw.get("activations", {}):
        out["exchange"] = _sequence_exchange(raw, axes, head_axis, data, itemsize,
                                             window=section.window)
    return out


def _sequence_exchange(raw: dict, axes: dict, head_axis, data: int, itemsize: int,
                       window=None) -> dict:
    """What each device sends for one self-attention layer with the tokens over the
    mesh's token axes (``sharded.run``; cross-attention's exchange of its queries for
    heads over ``sp`` not counted): over ``sp``, where the heads divide it,
    Ulysses' all-to-alls (queries, keys and values in, the output back: a device
    keeps 1/S of each share); round the ring (``ring``, and ``sp`` where the heads do
    not divide it, R devices in all) each device's key and value shares, R - 1 hops.
    A call under ``window`` (``window.attend_windowed``) passes nothing round: those R
    devices gather every token of their heads' keys and values, each device's share
    sent to R - 1 others, and take their query tiles' rows from the devices holding
    them and send the output back (``exchange.routes``, from the video's token grid,
    ``raw["grid"]``), or, where the tiles are not routed, gather the queries and the
    output too. Per step where the family says its layers and transformer calls a
    step."""
    batch, heads, tokens, _ = raw["attention"]["self"]
    width = raw["activations"]["hidden"][2]
    local_batch = batch // data if batch % data == 0 else batch
    cut = math.prod(axes[axis] for axis in sharding.token_axes(axes))
    share = local_batch * tokens * width * itemsize // cut  # one tensor's, on one device
    ulysses = axes[head_axis] if head_axis == sharding.SEQUENCE_AXIS \
        and heads % axes[head_axis] == 0 else 1
    if head_axis not in (None, sharding.SEQUENCE_AXIS) and heads % axes.get(head_axis, 1) == 0:
        share //= axes.get(head_axis, 1)  # heads over tp beside a ring: a part of each
    circle = cut // ulysses
    around = "all-gather" if window is not None else "ring"
    kinds = [kind for kind, size in (("all-to-all", ulysses), (around, circle)) if size > 1]
    sent = 4 * share * (ulysses - 1) // ulysses + 2 * share * (circle - 1)  # keys, values
    if window is not None and circle > 1:  # and the queries and the output
        routed = _routed_rows(raw, window, axes, head_axis)
        if routed is None:
            sent += 2 * share * (circle - 1)
        else:  # a row: one token of the heads a device holds
            sent += routed * share * cut // (tokens * ulysses)
            kinds.append("collective-permute")
    per_step = sent * raw["layers"] * raw["calls_per_step"] if "layers" in raw else None
    return {"kind": " and ".join(kinds), "bytes_per_layer_and_device": sent,
            "bytes_per_step_and_device": per_step}


def _routed_rows(raw: dict, window, axes: dict, head_axis) -> int | None:
    """The query rows each device sends round the ring, and output rows back, for a
    window whose tiles are routed (``exchange.applies``: the ring alone splits them, as
    ``window.tile_layout`` lays them out); None where they are gathered (or the token
    grid is unknown)."""
    ring = sharded.ring_of(sharding.token_axes(axes))
    if raw.get("grid") is None or not ring:
        return None
    tiling = Tiling(tuple(raw["grid"]), tuple(window.tile), tuple(window.reach),
                    window.global_frames)
    batch, heads, _, _ = raw["attention"]["self"]
    seq = sharded.layout_of(axes, (batch, heads, len(tiling.table[0])), None, head_axis)[2]
    if not exchange.applies(tiling, axes, ring, sharded.joined(ring + ((seq,) if seq
                                                                        else ()))):
        return None
    return sum(plan.rows_sent for plan in exchange.routes(tiling, axes[ring[0]]))


#: attention that materialises every score holds at least the scores and their softmax
MATERIALISED_COPIES = 2


def attention_need(recipe: Recipe, registry: Registry, weights_bytes: int,
                   step: dict) -> dict | None:
    """What a device needs for its ``weights_bytes`` and the largest attention's scores
    of one layer (``step``: ``step_costs``), as the recipe's backend keeps them: every
    score, twice (scores and softmax) where materialised (torchax's default,
    ``reference``); blocks of them (the blockwise kernels). None where the step has no
    attention."""
    costs = (step or {}).get("attention", {})
    if not costs:
        return None
    needs = [_scores_need(recipe, registry, name, cost) for name, cost in costs.items()]
    worst = max(needs, key=lambda need: need["copies"] * need["scores"])
    copies = worst.pop("copies")
    return {**worst, "weights": weights_bytes, "bytes": weights_bytes + copies * worst["scores"]}


def _scores_need(recipe: Recipe, registry: Registry, name: str, cost: dict) -> dict:
    """One kind of attention's scores on a device, as the backend its calls run keeps
    them (``attention.cross_backend`` for cross-attention, where set)."""
    backend = backends.for_call(recipe.attention, *cost["shape"][2:])
    materialised = backends.materialises(backend, registry.attention)
    if materialised:
        # the plan counts float32 scores (Porter's reference kernel); torchax's own
        # lowering (no backend) keeps them in the model's dtype
        itemsize = 4 if backend is not None else {"float32": 4}.get(recipe.model.dtype, 2)
        scores = cost["reference_bytes_per_device"] * itemsize // 4
    else:
        scores = cost["blockwise_bytes_per_device"]
    return {"attention": name, "shape": cost["shape"], "scores": scores,
            "materialised": materialised,
            "copies": MATERIALISED_COPIES if materialised else 1}
