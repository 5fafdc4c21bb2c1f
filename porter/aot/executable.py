"""One declared program lowered with abstract values and compiled by the target's
compiler: its memory, cost and collectives per chip, or the compiler's refusal."""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from porter.aot import hlo
from porter.aot.programs import Input, Program, State
from porter.errors import Interrupted
from porter.runtime import atomic
from porter.shims.compat import import_torchax
from porter.shims.carried import Cache
from porter.shims.interop import array_dtype
from porter.shims.tracing import model_frame, needs_values
from porter.transforms import attention, jit, sharding
from porter.transforms.jit import lifting, scan
from porter.transforms.jit.autosplit import as_keywords


@dataclass
class Compiled:
    """What the target's compiler made of one program (bytes and costs per chip)."""

    program: Program
    trace_s: float = 0.0  # tracing the model to a JAX program (on this host)
    compile_s: float = 0.0  # the target's compiler
    weights_bytes: int = 0  # this program's weights on one chip (the plan's figure)
    memory: dict = field(default_factory=dict)  # XLA's memory analysis, bytes
    flops: float = 0.0  # XLA's count, and attention kernels' it cannot see inside
    kernel_flops: float = 0.0  # attention's, counted while tracing
    matmul_flops: dict = field(default_factory=dict)  # operand kind -> FLOPs (hlo.py)
    bytes_accessed: float = 0.0
    collectives: dict = field(default_factory=dict)  # kind -> hlo.Collective
    scanned: dict = field(default_factory=dict)  # block list -> blocks, run as one scan
    refused: str | None = None  # the compiler's reason, when it would not compile it
    failed: str | None = None  # why it could not be traced (model code), when it was not
    #: (shape, sharding) of each tensor of the ``Cache`` it returns, in order: how a run
    #: hands the cache to the chunk loop's next call
    carried_out: list | None = None
    #: the arguments it took as constants (sizes it could not be traced without)
    sized: tuple = ()
    #: (argument, slot path) -> (shape, sharding) of each slot it wrote in an object it
    #: takes (``State``): how a run hands them to the next call with that object
    written_out: dict = field(default_factory=dict)

    @property
    def peak_bytes(self) -> int:
        """The program's own peak on its busiest chip: arguments (weights and inputs),
        outputs and temporaries, less what outputs reuse of donated inputs, and its
        code."""
        m = self.memory
        return (m.get("argument", 0) + m.get("output", 0) + m.get("temporary", 0)
                - m.get("alias", 0) + m.get("generated_code", 0))


def compile_program(port, program: Program, keep: Path | None = None,
                    carried: list | None = None, written: dict | None = None) -> Compiled:
    """Lower ``program`` on ``port``'s component with abstract weights and inputs, in
    the shardings a run uses, and compile it for the target. ``carried``: the shapes
    and shardings of the cache the chunk loop's previous program returned
    (``Compiled.carried_out``), which a run passes to this one as it got it (where they
    are this program's cache's shapes; else the cache is given replicated).
    ``written``: the slots earlier programs wrote in the objects this one takes
    (``Compiled.written_out``), given as they were written where the shapes agree."""
    component = port.components[program.component]
    result = Compiled(program, weights_bytes=component.weights_bytes_per_chip)
    start = time.perf_counter()
    try:
        lowered, kernel_flops, result.sized = _traced(port, component, program, carried,
                                                      written or {})
    except Interrupted:  # kill (SIGTERM) while tracing: the user's stop, not the model's
        raise
    except Exception as exc:  # noqa: BLE001 - model code that cannot be traced
        result.failed = _traced_failure(exc)
        return result
    result.trace_s = time.perf_counter() - start
    start = time.perf_counter()
    try:
        executable = lowered.compile()
    except Interrupted:  # nor a compiler's refusal: the next program would go on
        raise
    except Exception as exc:  # noqa: BLE001 - the compiler's refusal, in its words
        result.compile_s = time.perf_counter() - start
        result.refused = _refusal(exc)
        return result
    result.compile_s = time.perf_counter() - start
    text = executable.as_text()
    if keep is not None:  # the optimized HLO, with the compiler's per-instruction estimates
        atomic.write_bytes(keep, text.encode())
    result.memory = _memory(executable)
    result.flops, result.bytes_accessed = _costs(executable, text, sum(kernel_flops),
                                                 result.weights_bytes)
    result.kernel_flops = sum(kernel_flops)
    result.matmul_flops = hlo.matmul_flops(text)
    if hlo.opaque_kernels(text):  # an int8 attention kernel's Q.K^T, out of XLA's sight
        for kind, flops in kernel_flops.matmuls.items():
            result.matmul_flops[kind] = result.matmul_flops.get(kind, 0.0) + flops
    result.collectives = hlo.collectives(text, port.runtime.mesh.devices.size)
    result.scanned = {name: len(component.module._modules[name])
                      for name in component.scanned}
    result.carried_out = _returned_cache(executable.output_shardings, lowered.out_info)
    result.written_out = _written_slots(port, component, program,
                                        executable.output_shardings, lowered.out_info)
    return result


def _written_slots(port, component, program: Program, shardings, shapes) -> dict:
    """(argument, slot path) -> (shape, sharding) of the slots a program wrote in the
    objects it takes: a lifted call's outputs are (result, {argument: {slot path:
    array}}), ``lifting.lifted``'s."""
    if not any(name.startswith(lifting.KINDS)
               for name in _arguments(port, component, program)[1]):
        return {}
    return {(name, path): (tuple(shapes[1][name][path].shape), where)
            for name, slots in shardings[1].items() for path, where in slots.items()}


def _traced(port, component, program: Program, carried: list | None, written: dict):
    """``_lower``'s, and the names of the sizes it took as constants: as a run traces a
    call, first as given, then, where that fails and the call takes sizes made on the
    host, with them as constants (``lifting``). If that fails too, the first failure."""
    try:
        return (*_lower(port, component, program, carried, written), ())
    except Exception as first:  # noqa: BLE001 - compile_program reports it
        sized = tuple(sorted(
            name for name, value in _arguments(port, component, program)[1].items()
            if isinstance(value, Input) and value.sizes is not None))
        # as a run: only where Python needed a value (Porter names the model's line
        # around JAX's error), and not for a scanned component, which a run refuses
        if not sized or component.scanned or not needs_values(first):
            raise
        try:
            return (*_lower(port, component, program, carried, written, sized), sized)
        except Interrupted:
            raise
        except Exception:  # noqa: BLE001 - the retry's own failure says less
            raise first from None


def _arguments(port, component, program: Program,
               sized: tuple = ()) -> tuple[tuple, dict]:
    """The program's arguments as a run's compiled call takes them (``lifting``): an
    object it writes (``State``) as its slots, with its classes static beside them
    (``lifting.KINDS``); the ``sized`` ones as constants (``lifting.Sizes``).
    Positional ones named first where either is among them, as a run names them."""
    args, kwargs = program.args, dict(program.kwargs)
    if any(isinstance(v, State) or getattr(v, "sizes", None) is not None for v in args):
        # what _lower runs: a family's function (module, ...), else the module's method
        method = port.family.compiled_functions.get(program.component, {}).get(
            program.method) or getattr(type(component.module), program.method, None)
        if callable(method):
            args, kwargs = as_keywords(method, args, kwargs)
    lifted: dict = {}
    for name, value in kwargs.items():
        if isinstance(value, State):
            lifted[name], lifted[lifting.KINDS + name] = value.tree, value.kinds
        else:
            lifted[name] = value.sizes if name in sized else value
    return args, lifted


def _lower(port, component, program: Program, carried: list | None = None,
           written: dict | None = None, sized: tuple = ()):
    """(the lowered program, attention FLOPs per chip counted while tracing it: an
    ``attention.Tally``), with the ``sized`` arguments constants. A program that takes
    an object it writes returns the slots it wrote beside its result, as a run's; the
    slots earlier programs wrote (``written``) are given as those left them."""
    import jax

    interop = import_torchax().interop
    arguments = _arguments(port, component, program, sized)
    template, leaves, in_cache = _split(arguments)
    shardings = _input_shardings(port, component, program)
    placed = [shardings.get(path[:2]) for path, _ in leaves]
    if carried is not None and [shape for shape, _ in carried] == [
            tuple(leaves[index][1].shape) for index in in_cache]:
        # as the previous call left it: given replicated, each chip would slice its
        # share out of a whole cache it never holds in a run (13% of a later 480p Wan
        # frame's decode cycles on v6e-8)
        for index, (_, where) in zip(in_cache, carried):
            placed[index] = where
    objects = {name for name in arguments[1] if name.startswith(lifting.KINDS)}
    for index, (path, leaf) in enumerate(leaves):
        # a slot an earlier call wrote, as it left it: given replicated, each chip would
        # hold every layer's keys and values (30.6 GiB of Wan-Animate-2's cache on v6e-8)
        if lifting.KINDS + str(path[1]) not in objects:
            continue
        shape, where = (written or {}).get((path[1], ".".join(map(str, path[2:]))),
                                           (None, None))
        if shape == tuple(leaf.shape):
            placed[index] = where
    abstract_leaves = [_abstract(leaf, where) for (_, leaf), where in zip(leaves, placed)]
    jittable = component.jittable
    functional = scan.scanned_call(jittable.functional_call, component.module,
                                   component.scanned) \
        if component.scanned else jittable.functional_call

    method = port.family.compiled_functions.get(program.component, {}).get(
        program.method) or _method(component.module, program.method)

    def call(params, buffers, values):
        args, kwargs = _join(template, values)
        with attention.disabled() if component.attention_skipped else _nothing():
            return lifting.lifted(functools.partial(functional, method, params, buffers))(
                *args, **kwargs)

    jit.output_classes_as_pytrees()
    options = {"compiler_options": dict(port.runtime.xla_options)} \
        if port.runtime.xla_options else {}
    with port.active(program.component), attention.counted() as kernel_flops:
        lowered = jax.jit(interop.jax_view(call), **options).lower(
            *component.state, abstract_leaves)
    return lowered, kernel_flops


def _method(module, name: str):
    """What torchax's functional call runs: the component's method ``name``, or the
    forward of its submodule at path ``name`` (a program of ``submodule_calls``),
    with every weight of the component given by name."""
    import torch

    if isinstance(getattr(module, name.split(".")[0], None), torch.nn.Module):
        return lambda model, *args, **kwargs: model.get_submodule(name)(*args, **kwargs)
    return name


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def _memory(executable) -> dict:
    analysis = executable.memory_analysis()
    return {"argument": int(analysis.argument_size_in_bytes),
            "output": int(analysis.output_size_in_bytes),
            "alias": int(analysis.alias_size_in_bytes),
            "temporary": int(analysis.temp_size_in_bytes),
            "generated_code": int(analysis.generated_code_size_in_bytes)}


def _costs(executable, text: str, kernel_flops: float,
           weights: int) -> tuple[float, float]:
    """(FLOPs, bytes accessed) per chip and call. XLA's counts, completed where they
    fall short: the attention kernels' FLOPs it cannot see inside (custom calls), the
    matmuls and arithmetic of every trip of a loop after the first (it counts a loop's body once:
    a scan over 40 blocks, one block), and at least the program's weights read once
    (a scan's body reads one block's)."""
    cost = executable.cost_analysis() or {}
    if isinstance(cost, list):  # older JAX: one dict per computation
        cost = cost[0] if cost else {}
    flops = float(cost.get("flops", 0.0)) + hlo.repeated_flops(text)
    if hlo.opaque_kernels(text):
        flops += kernel_flops
    return flops, max(float(cost.get("bytes accessed", 0.0)), float(weights))


def _input_shardings(port, component, program: Program) -> dict:
    """Path of an input -> its sharding in a run: a transformer's keyword inputs as
    ``sharding.input_specs`` places them (``ShardedInputs``), one device for a
    component run on one device, else replicated (what ``to_device`` gives host
    values)."""
    from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

    mesh = port.runtime.mesh
    if component.one_device:
        return _Everywhere(SingleDeviceSharding(mesh.devices.flat[0]))
    found = _Everywhere(NamedSharding(mesh, PartitionSpec()))
    specs = sharding.input_specs(port.recipe, program.component, port.runtime.axes,
                                 port.family, component.module)
    for key, spec in specs.items():
        found[("kwargs", key)] = NamedSharding(mesh, sharding.partition_spec(spec))
    return found


class _Everywhere(dict):
    """A dict with a default for every path it was not given."""

    def __init__(self, default):
        super().__init__()
        self.default = default

    def get(self, key, default=None):
        return super().get(key, self.default)


def _split(value, path=()):
    """(template, [(path, Input)], the indices of the Inputs a ``Cache`` holds):
    ``value`` with each Input replaced by its index. A path is ("args", index, ...)
    or ("kwargs", name, ...), then where it lies inside that argument."""
    leaves: list = []
    cached: list[int] = []

    def walk(v, where, inside=False):
        if isinstance(v, Input):
            leaves.append((where, v))
            if inside:
                cached.append(len(leaves) - 1)
            return _Slot(len(leaves) - 1)
        if isinstance(v, dict):
            return {k: walk(x, where + (k,), inside) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            inside = inside or isinstance(v, Cache)
            return type(v)(walk(x, where + (i,), inside) for i, x in enumerate(v))
        return v

    template = walk(value, path)
    # a keyword input's path: ("kwargs", name); a positional one's ("args", index)
    named = [((("args", "kwargs")[p[0]],) + p[1:], leaf) for p, leaf in leaves]
    return template, named, cached


@dataclass(frozen=True)
class _Slot:
    index: int


def _returned_cache(shardings, shapes) -> list | None:
    """(shape, sharding) of each tensor of the ``Cache`` in a program's outputs, in order
    (None where it returns none): from its output shardings and its output shapes, two
    trees of one structure."""
    if isinstance(shardings, Cache):
        return [(tuple(shape.shape), sharding) for sharding, shape in zip(shardings, shapes)
                if not Cache.is_marker(sharding)]
    if isinstance(shardings, (list, tuple)):
        for value, shape in zip(shardings, shapes):
            found = _returned_cache(value, shape)
            if found is not None:
                return found
    return None


def _join(template, values):
    def walk(v):
        if isinstance(v, _Slot):
            return values[v.index]
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(walk(x) for x in v)
        return v
    return walk(template)


def _abstract(leaf: Input, sharding):
    import jax

    return jax.ShapeDtypeStruct(leaf.shape, array_dtype(leaf.dtype), sharding=sharding)


_NEEDED = re.compile(r"required for ([\w ]+?) \(([\d.]+)([KMGT]?)\) exceeds available HBM "
                     r"\(([\d.]+)([KMGT]?)\)")


def _refusal(exc: Exception) -> str:
    text = str(exc)
    lines = [l for l in text.splitlines() if l.strip()]
    first = next((l for l in lines if "RESOURCE_EXHAUSTED" in l), lines[0] if lines else
                 type(exc).__name__)
    return first.strip()


def needed_bytes(refusal: str) -> tuple[int, int] | None:
    """(bytes needed, bytes available) from the compiler's out-of-memory message."""
    found = _NEEDED.search(refusal)
    if not found:
        return None
    scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    return (int(float(found.group(2)) * scale[found.group(3)]),
            int(float(found.group(4)) * scale[found.group(5)]))


def _traced_failure(exc: Exception) -> str:
    """Why model code could not be traced with abstract values, with its file:line."""

    where = model_frame(exc)
    said = str(exc).strip()
    reason = f"{type(exc).__name__}: {said.splitlines()[0][:200] if said else ''}"
    return reason + (f" at {where}" if where else "")

