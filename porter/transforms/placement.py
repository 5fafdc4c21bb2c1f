"""Host tensors into their place on the mesh, one tensor at a time.

Each tensor goes from host memory straight into its ``NamedSharding``: no
component is first put whole on one device (``module.to("jax")`` would put
every tensor on device 0, and a 14B transformer does not fit on one chip).
In a multi-process run each process reads and places only the rows its own
devices hold. Once a tensor is placed its host copy is dropped, so host
memory holds the tensors in flight (two at most), not a component.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from porter.errors import LoadError
from porter.families import row_blocks
from porter.runtime import distributed, finite, mesh_text, notices
from porter.shims import lazy
from porter.shims.interop import as_placed, jax_dtype, place, to_device
from porter.shims.walk import named_tensors, tensor_slots
from porter.transforms import Checking, Pass, sharding, unknown_components
from porter.transforms.building import Placement
from porter.transforms.sharding import Assignment, assign, partition_spec

torch = lazy.module("torch", __name__)

if TYPE_CHECKING:
    from porter.errors import Problem
    from porter.recipe import Recipe
    from porter.runtime import Runtime
    from porter.transforms.building import Building

#: tensors read and placed ahead of the one being installed, at most this many and
#: this many bytes: both are mostly filling fresh pages, which threads do in parallel
READ_AHEAD = 4
READ_AHEAD_BYTES = 512 * 2**20
#: host bytes an 8-bit weight being quantized as read holds per value, beyond its own
#: (its rows in the recipe's dtype, their float32 copy): what read-ahead counts
QUANTIZING = 6


def apply(module: torch.nn.Module, runtime: Runtime, rules, weights=None,
          nonfinite: dict | None = None, pending: dict | None = None) -> list[Assignment]:
    """Place every tensor of ``module`` on the mesh by its rule (``sharding``).

    A tensor's values come from ``weights`` (a ``porter.loading.weights.ComponentWeights``)
    when the checkpoint holds it, otherwise from the module's own host tensor.
    Each slot then holds the placed tensor, so the host copy is freed as soon as it
    is placed. float64 and int64 tensors arrive as float32 and int32 (JAX runs with
    x64 disabled). Each parameter's NaN and infinite values are counted on the host
    as it passes, in its final dtype (one read at memory speed), into ``nonfinite``
    (name -> count, only the tensors that have any), where given. Buffers are not
    counted: a mask may hold -inf on purpose. ``pending`` (weight name ->
    ``quantize.Pending``) names the weights quantized as they are read: each one's rows
    are read, counted and quantized, and its scales placed beside it.
    """
    from jax.sharding import NamedSharding

    pending = pending or {}
    slots = tensor_slots(module)
    assignments = assign(named_tensors(module), rules)
    shardings = [NamedSharding(runtime.mesh, partition_spec(a.spec)) for a in assignments]
    index = {a.name: i for i, a in enumerate(assignments)}
    scales = {p.scale for p in pending.values()}
    order = [i for i, a in enumerate(assignments) if a.name not in scales]

    def placed_array(j: int):  # in a worker thread: reads and copies run in parallel
        i = order[j]
        a = assignments[i]
        store, key = slots[a.name][0]
        if a.name in pending:
            return _quantized_arrays(a, pending[a.name], shardings[i],
                                     shardings[index[pending[a.name].scale]], weights,
                                     nonfinite)
        # a weight quantized on the host has NaN or infinite scales where it had any
        counted = nonfinite if isinstance(store[key], torch.nn.Parameter) \
            or a.name.endswith(".weight_scale") else None
        return _placed_array(a, store[key], shardings[i], weights, counted)

    # a weight quantized as read holds its source rows and a float32 copy meanwhile
    sizes = [assignments[i].nbytes * (1 + QUANTIZING if assignments[i].name in pending
                                      else 1) for i in order]
    for j, array in _read_ahead(sizes, placed_array):
        a = assignments[order[j]]
        if a.name in pending:
            array, scale = array
            _install(slots, assignments[index[pending[a.name].scale]], scale, runtime)
        _install(slots, a, array, runtime)
        del array
    _plain_attributes(module, runtime)
    return assignments


def _install(slots: dict, a: Assignment, array, runtime: Runtime) -> None:
    """The placed ``array`` in every slot of tensor ``a`` (its host copy is dropped)."""
    from torchax.tensor import Tensor

    store, key = slots[a.name][0]
    tensor = store[key]
    with runtime.env:  # only here: it would intercept every torch call on the host
        placed = Tensor(array, runtime.env)
        if isinstance(tensor, torch.nn.Parameter):
            placed = torch.nn.Parameter(placed, requires_grad=tensor.requires_grad)
    for store, key in slots[a.name]:
        store[key] = placed


def _quantized_arrays(a: Assignment, pending, sharding, scale_sharding, weights,
                      nonfinite):
    """A weight read from the checkpoint, quantized row by row as read: (values, scales),
    each placed; only this process's rows are read, in the recipe's dtype first (the
    values a weight on the host is quantized from). Its NaN and infinities are counted
    there, before it is scaled."""
    if weights is None or a.name not in weights.entries:
        raise LoadError(f"{a.name} has no value: it is in no weight file",
                        hint="is the checkpoint complete?")
    rows = local_rows(a.shape, sharding)
    source = weights.read(a.name, pending.dtype, rows)
    if nonfinite is not None:
        bad = finite.count(source)
        if bad:
            nonfinite[a.name] = bad
    values, scale = pending.format.quantize(source)
    del source
    return (place(values, a.shape, sharding, rows),
            place(scale, a.shape[:1], scale_sharding, rows))


def _plain_attributes(module: torch.nn.Module, runtime: Runtime) -> None:
    """Tensors a module keeps in plain attributes (``self.freqs = ...`` in ``__init__``:
    neither parameter nor buffer, so ``named_tensors`` does not see them) go onto the
    mesh replicated, as the module's own tensors do: used in ``forward`` beside JAX
    tensors, a host tensor is an error under torchax. Meta tensors (an abstract model's)
    have no values to move and stay."""
    from torchax.tensor import Tensor

    for sub in module.modules():
        for key, value in list(vars(sub).items()):
            if isinstance(value, torch.Tensor) and not isinstance(value, Tensor) \
                    and not value.is_meta:
                setattr(sub, key, to_device(value, runtime))


def _read_ahead(sizes: list[int], read):
    """(i, read(i)) for each index of ``sizes``, in order, with reads of the next
    ones under way (READ_AHEAD tensors and READ_AHEAD_BYTES at most, always one)."""
    with ThreadPoolExecutor(READ_AHEAD) as pool:
        pending: dict = {}
        ahead = 0
        for i in range(len(sizes)):
            ahead = max(ahead, i)
            while ahead < len(sizes) and (not pending or (
                    len(pending) < READ_AHEAD
                    and sum(sizes[j] for j in pending) + sizes[ahead] <= READ_AHEAD_BYTES)):
                pending[ahead] = pool.submit(read, ahead)
                ahead += 1
            yield i, pending.pop(i).result()


def _placed_array(a: Assignment, tensor, sharding, weights, nonfinite=None):
    """One tensor as a jax.Array placed by ``sharding``: from the checkpoint, from the
    host tensor, or (a module shared by two components, already on JAX) resharded.
    Only the rows this process's devices hold are read."""
    import jax

    if hasattr(tensor, "jax"):
        return jax.device_put(tensor.jax(), sharding)
    rows = local_rows(a.shape, sharding)
    dtype = jax_dtype(tensor.dtype)
    if weights is not None and a.name in weights.entries:
        host = weights.read(a.name, dtype, rows)
    elif tensor.is_meta:
        raise LoadError(f"{a.name} has no value: it is in no weight file",
                        hint="is the checkpoint complete?")
    else:
        host = as_placed(tensor.data[rows] if a.shape else tensor.data)
    if nonfinite is not None:
        bad = finite.count(host)
        if bad:
            nonfinite[a.name] = bad
    return place(host, a.shape, sharding, rows)


def local_rows(shape: tuple[int, ...], sharding) -> slice:
    """The rows (first dimension) that this process's devices hold, as one span."""
    if not shape:
        return slice(None)
    spans = [index[0] for index in sharding.addressable_devices_indices_map(shape).values()]
    starts = [s.start or 0 for s in spans]
    stops = [shape[0] if s.stop is None else s.stop for s in spans]
    return slice(min(starts), max(stops))


def device_bytes(module: torch.nn.Module) -> dict[str, int]:
    """Bytes of ``module``'s placed tensors each device of this process holds, read
    from the arrays themselves."""
    held: dict[str, int] = {}
    for _, tensor in named_tensors(module):
        for shard in tensor.jax().addressable_shards:
            held[str(shard.device)] = held.get(str(shard.device), 0) + shard.data.nbytes
    return held


def report(module, assignments: list[Assignment], axes: dict[str, int], weights=None) -> dict:
    """What one component's placement did: where its values came from (and how many
    bytes this process read from the checkpoint), its bytes, and per device what the
    plan says against what the devices hold."""
    held = device_bytes(module).values()
    source = {"from": "host"} if weights is None else {"from": "checkpoint",
                                                        "read_bytes": weights.read_bytes}
    return {**source, "tensors": len(assignments),
            "bytes": sum(a.nbytes for a in assignments),
            "planned_bytes_per_device": sum(a.bytes_per_device(axes) for a in assignments),
            "bytes_per_device": max(held, default=0),
            "min_bytes_per_device": min(held, default=0)}


def unsharded(assignments: list[Assignment], activation_rules) -> bool:
    """Does nothing split this component: every tensor replicated, no activation rule?"""
    return not activation_rules and all(not a.spec for a in assignments)


def on_one_device(compiled, runtime: Runtime) -> None:
    """Run a compiled component that nothing shards on one device per process.

    Over a mesh, a program whose inputs are all replicated is run by every device,
    each doing the whole computation: the compute and its temporary memory are paid
    once per device (on virtual CPU devices, eight times over on the same cores; a
    Wan VAE decode at 8 devices held 2.6 GiB of temporaries instead of 0.3). The
    weights stay where the plan puts them (a copy on every device); the compiled
    methods of ``compiled`` (a torchax JittableModule, changed in place) get this
    process's first device's copy of each weight and of each input, and their
    results go back on the mesh, replicated, as a mesh-wide call returns them.
    """
    import jax
    from torch.utils import _pytree
    from torchax.tensor import Tensor

    device = next(d for d in runtime.mesh.devices.flat
                  if d.process_index == jax.process_index())

    def local(tensor):
        array = tensor.jax()
        shard = next((s.data for s in array.addressable_shards if s.device == device), None)
        return Tensor(shard if shard is not None else jax.device_put(array, device),
                      runtime.env)

    def on_mesh(tensor):
        array = tensor.jax()
        return Tensor(jax.make_array_from_callback(array.shape, runtime.replicated(),
                                                   lambda _: array), runtime.env)

    def on_jax(move):  # torchax's Tensor, and its View (what slicing may return)
        return lambda t: move(t) if hasattr(t, "jax") else t

    def locally(call):
        @functools.wraps(call)  # the method's signature, which pipelines read
        def run(*args, **kwargs):
            args, kwargs = _pytree.tree_map_only(torch.Tensor, on_jax(local), (args, kwargs))
            return _pytree.tree_map_only(torch.Tensor, on_jax(on_mesh), call(*args, **kwargs))
        return run

    # the jitted methods read these at each call: this device's copies from now on
    compiled.params = {k: local(v) for k, v in compiled.params.items()}
    compiled.buffers = type(compiled.buffers)({k: local(v) for k, v in compiled.buffers.items()})
    for method, call in list(compiled._jitted.items()):
        compiled._jitted[method] = locally(call)


# ------------------------------------------------------------------------- the pass

def _apply(b: Building) -> None:
    b.say("placing weights on the mesh" + (
        f" ({', '.join(b.load.weights)} read from the checkpoint tensor by tensor)"
        if b.load.weights else ""))
    b.placement = Placement()
    nonfinite = {}
    for name, component in b.modules.items():
        found: dict = {}
        weights = b.load.weights.get(name)
        assignments = apply(component, b.runtime, _weight_rules(b.recipe, name), weights,
                            found, b.quantize.pending.get(name))
        nonfinite.update({f"{name}.{tensor}": count for tensor, count in found.items()})
        b.placement.reports[name] = report(component, assignments, b.runtime.axes, weights)
        _constrain(b, name, component, assignments)
        if name not in b.recipe.sharding.activations and b.placement.activations[name]:
            # a default split: the axes it splits over (a VAE's feature maps' width:
            # sharding.vae_split; a transformer's batch and tokens: sequence_split; its
            # family's own, as FAR's residual's width: default_activations)
            spec = b.placement.activations[name][0].spec
            b.placement.reports[name]["default_split"] = [
                axis for entry in spec if entry not in (None, sharding.LEADING)
                for axis in ([entry] if isinstance(entry, str) else entry)]
        # the family's placement of the inputs its calls are given (FAR's cache)
        inputs = sharding.family_inputs(b.recipe, name, b.runtime.axes, b.family,
                                        getattr(component, "config", None))
        if inputs:
            b.placement.reports[name]["default_inputs"] = inputs
    refuse_unscaled([refusal for weights in b.load.weights.values()
                     for refusal in weights.unscaled.values()])
    refuse_nonfinite(nonfinite, b.recipe)


def refuse_unscaled(found: list) -> None:
    """fp8 weights read with no scale whose values are a scaled file's (``found``: the
    LoadError of each, this process's rows) are an error on every process, decided
    together so that none runs on alone."""
    if distributed.anywhere(bool(found)):
        raise found[0] if found else LoadError(
            "fp8 values another process read cannot be unscaled weights",
            hint="see process 0's message")


def _abstract(b: Building) -> None:
    b.placement = Placement()
    for name, module in b.modules.items():
        assignments = assign(named_tensors(module), _weight_rules(b.recipe, name))
        _constrain(b, name, module, assignments)


def _weight_rules(recipe: Recipe, name: str) -> list:
    return recipe.sharding.weights.get(name, [])


def _constrain(b: Building, name: str, module, assignments) -> None:
    """The activation shardings on ``module`` (the recipe's, or the default: a
    transformer's tokens over ``sp``, a VAE's split, on a TPU in row blocks);
    a component no rule shards is remembered (compiled whole, it runs on one device)."""
    b.placement.assignments[name] = assignments
    activations = sharding.activation_rules(b.recipe, name, module, b.runtime, b.family)
    b.placement.activations[name] = activations
    sharding.constrain_activations(module, b.runtime, activations)
    if sharding.in_row_blocks(b.recipe, name, module, b.runtime, activations):
        _keep_in_blocks(b, name, module)
    if unsharded(assignments, activations):
        b.placement.unsharded.add(name)


def _keep_in_blocks(b: Building, name: str, module) -> None:
    """Wan's decoder on row blocks (``porter.families.row_blocks``), said in the run
    record (``porter compile``'s abstract pass keeps no reports)."""
    if row_blocks.keep_in_blocks(module) and name in b.placement.reports:
        b.placement.reports[name]["row_blocks"] = row_blocks.BLOCKS


def refuse_nonfinite(found: dict, recipe: Recipe) -> None:
    """NaN or infinity in the weights (``found``: tensor -> count, this process's rows)
    is an error on every process, decided together so that none runs on alone."""
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


def _check(c: Checking) -> list[Problem]:
    return sharding.rule_problems(c.recipe) + sharding.sequence_problems(c.recipe, c.family)


def _fit(c: Checking) -> list[Problem]:
    recipe, family, modules, axes = c.recipe, c.family, c.modules, c.axes
    found = unknown_components(recipe, modules, {
        "sharding.weights": recipe.sharding.weights,
        "sharding.activations": recipe.sharding.activations})
    for name, sketch in modules.items():
        assignments = assign(sketch.tensors.items(), _weight_rules(recipe, name))
        found += sharding.shape_problems(recipe, name, assignments, axes)
    transformer = modules.get("transformer")
    if transformer is not None:
        shapes = family.transformer_inputs(recipe, transformer.config)
        found += sharding.input_problems(recipe, shapes, axes)
        found += sharding.token_problems(
            recipe, (family.estimates(recipe, transformer.config) or {}).get("tokens"), axes)
    return found


def _detail(c: Checking) -> str:
    recipe = c.recipe
    weights = sum(len(rules) for rules in recipe.sharding.weights.values())
    activations = sum(len(rules) for rules in recipe.sharding.activations.values())
    mesh = mesh_text(c.axes or recipe.mesh)
    return (f"mesh {mesh}: {weights} weight rule(s), {activations} activation rule(s)"
            + _inputs_detail(c)
            + (f"; the transformer's tokens over {' x '.join(tokens)}"
               if (tokens := sharding.token_axes(recipe.mesh)) else ""))


def _inputs_detail(c: Checking) -> str:
    """The transformer's keyword inputs placed on the mesh: the recipe's
    (``sharding.inputs``) and its family's own (``default_inputs``)."""
    transformer = (c.modules or {}).get("transformer")
    known = c.family is not None and transformer is not None and c.axes is not None
    defaults = list(sharding.family_inputs(c.recipe, "transformer", c.axes, c.family,
                                           transformer.config)) if known else []
    said = [f"{whose}: {', '.join(names)}" for whose, names in (
        ("the recipe's", list(c.recipe.sharding.inputs)), ("its family's", defaults))
        if names]
    return f", transformer inputs placed ({'; '.join(said)})" if said else ""


PASS = Pass(
    "placement", ("mesh", "sharding"), "place every weight on the mesh in its sharding "
    "(read straight into shards where built empty); constrain activations",
    check=_check, fit=_fit, apply=_apply, abstract=_abstract, detail=_detail)
