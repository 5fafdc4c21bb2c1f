"""What a pipeline hands a compiled call besides tensors and plain values, made
traceable (``porter.transforms.jit.autosplit`` applies both):

- Objects the call writes (``is_state``): an argument that is an object holding
  tensors and nothing else (through lists, tuples and objects of its kind; a slot may
  be None, not written yet), such as Wan-Animate-2's key/value cache, which its
  reference pass fills and each step reads. Held as a static argument (by identity)
  a new object would make a new program (a segment each) and a traced call's writes
  would leave tracers in it. It goes in as its tensors instead (``values``: a tree of
  dicts and lists, its classes a static argument), the call runs on a copy made of
  them (``build``), and the slots the call wrote in the copy come out beside the
  result (only those: a slot it only read is not copied out again) and are written
  into the caller's object (``written_back``).
- Sizes (``Sizes``): an integer tensor of at most 16 numbers that the pipeline made
  on the host (a grid's sizes, as the dry run keeps them), or a list of integers
  (Wan-Animate-2's ``origin_area=[height, width]``, which would go in as traced
  numbers, a list being no static argument), goes in as its values, static, and
  reaches the model as it was given: a list, or a tensor on the host, which PyTorch
  computes with at once while the call is traced (as it does a grid the model makes
  from shapes without a device), so ``grid[0][2].item()`` and ``grid.tolist()`` read
  numbers; a host tensor the model moves to the device is a constant the trace holds
  (``host_moves_kept``). If the call still cannot be traced (or fails otherwise, say
  on a host tensor meeting a device one), it splits as before. Only for a method whose
  call could not be traced otherwise, and from then on for its every call: a
  pipeline's integer timestep made on the host is such a tensor too, and a program
  per step would cost more than it saves.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from porter.shims import fixes as torchax_fixes
from porter.shims.compat import import_torchax

#: integer tensors this small are sizes, not data (the dry run's bound too)
SMALL = 16
#: the static argument that carries a state argument's classes: this prefix + its name
KINDS = "_porter_kinds_"


# ------------------------------------------------------------------ objects written

def is_state(value) -> bool:
    """An object (compared by identity, not a module or tensor) whose attributes hold
    tensors and None alone, through lists, tuples and objects of its kind (no cycle),
    with at least one such slot."""
    import torch

    if not _object(value):
        return False
    slots, seen = [], set()

    def walk(v) -> bool:
        if v is None or isinstance(v, torch.Tensor):
            slots.append(v)
            return True
        if type(v) in (list, tuple):
            return all(walk(x) for x in v)
        if not _object(v) or id(v) in seen:
            return False
        seen.add(id(v))
        return all(walk(x) for x in vars(v).values())

    return walk(value) and bool(slots)


def _object(value) -> bool:
    import torch

    cls = type(value)
    return (hasattr(value, "__dict__") and not isinstance(value, (torch.Tensor, type))
            and not isinstance(value, torch.nn.Module) and not callable(value)
            and cls.__eq__ is object.__eq__ and cls.__hash__ is object.__hash__)


@dataclass(frozen=True)
class Kinds:
    """The classes of a state argument and its structure, as a static argument: hashed,
    printed the same in every process (the trace cache's key holds it), and one value
    to pytrees (which would take a class inside a tuple for a function to wrap)."""

    tree: object


def kinds(value) -> Kinds:
    return Kinds(_kinds(value))


def _kinds(value):
    import torch

    if type(value) in (list, tuple):
        return (type(value).__name__, tuple(_kinds(v) for v in value))
    if _object(value):
        return (type(value), tuple((name, _kinds(v)) for name, v in sorted(vars(value).items())))
    if value is None or isinstance(value, torch.Tensor):
        return None  # a slot
    return ("value", type(value).__name__)  # written where a tensor goes: not a slot


def values(value):
    """A state argument as a tree JAX and PyTorch both walk: an object as a dict of its
    attributes, a list or tuple as a list, a slot as itself."""
    if type(value) in (list, tuple):
        return [values(v) for v in value]
    if _object(value):
        return {name: values(v) for name, v in vars(value).items()}
    return value


def build(kind: Kinds, tree):
    """A new object of ``kind`` holding ``tree``'s slots (inside the program)."""
    return _build(kind.tree, tree)


def _build(kind, tree):
    if kind is None:
        return tree
    cls, parts = kind
    if isinstance(cls, str):
        return (tuple if cls == "tuple" else list)(_build(k, v) for k, v in zip(parts, tree))
    made = object.__new__(cls)
    made.__dict__.update({name: _build(k, tree[name]) for name, k in parts})
    return made


def _slots(value, path=()):
    """(path, slot) for each slot of a state argument, in order; a path is a tuple of
    attribute names and list indices."""
    if type(value) in (list, tuple):
        for index, v in enumerate(value):
            yield from _slots(v, (*path, index))
    elif _object(value):
        for name, v in vars(value).items():
            yield from _slots(v, (*path, name))
    else:
        yield path, value


def snapshot(state) -> dict:
    """Each slot of a state argument as it is before a call: the tensor, and the array
    it holds (torchax writes in place by giving the same tensor another array)."""
    return {path: (slot, getattr(slot, "_elem", None)) for path, slot in _slots(state)}


def written(before: dict, state) -> dict:
    """The slots of ``state`` a call wrote since its ``snapshot`` (another tensor, or
    another array in the same one), by their path as one string
    (``layer_caches.3.key``: a dict key both pytrees take)."""
    return {".".join(map(str, path)): slot for path, slot in _slots(state)
            if path not in before
            or not _same((slot, getattr(slot, "_elem", None)), before[path])}


def write(target, slots: dict) -> None:
    """The ``written`` slots set in the state argument ``target``, by path."""
    for path, slot in slots.items():
        _with(target, path.split("."), slot)


def _same(a: tuple, b: tuple) -> bool:
    return all(x is y for x, y in zip(a, b))


def _with(target, parts: list[str], slot):
    """``target`` with the slot at ``parts`` set: an object or list in place, a tuple
    made again (its holder takes the new one)."""
    if not parts:
        return slot
    head, *rest = parts
    index = int(head) if head.isdigit() else None
    child = getattr(target, head) if index is None else target[index]
    made = _with(child, rest, slot)
    if type(target) is tuple:
        return (*target[:index], made, *target[index + 1:])
    if index is None:
        setattr(target, head, made)
    else:
        target[index] = made
    return target


class StateChanged(Exception):
    """A call changed a state argument's structure (added an attribute, grew a list,
    wrote a number where a tensor was): only its slots can come back out of a
    program."""


def lift(kwargs: dict) -> tuple[dict, dict]:
    """(``kwargs`` with each state argument as its ``values`` and its ``kinds`` beside it
    as a static argument, the state arguments by name). Host tensors in a state
    argument go to the device, as the call's other tensors do."""
    held = {name: v for name, v in kwargs.items() if is_state(v)}
    if not held:
        return kwargs, held
    lifted = {**kwargs}
    for name, value in held.items():
        lifted[name] = torchax_fixes.on_device(values(value))
        lifted[KINDS + name] = kinds(value)
    return lifted, held


def lifted(function):
    """``function`` taking lifted state arguments (``lift``) and ``Sizes``, and giving
    back, beside its result, the slots it wrote in each state argument (a dict by name;
    only when it took any)."""

    def call(*args, **kwargs):
        made = {name[len(KINDS):]: kwargs.pop(name) for name in list(kwargs)
                if name.startswith(KINDS)}
        copies = {name: build(kind, kwargs[name]) for name, kind in made.items()}
        given = {name: snapshot(copy) for name, copy in copies.items()}
        kwargs.update(copies)
        sized = any(isinstance(v, Sizes) for v in kwargs.values())
        kwargs = {k: v.given() if isinstance(v, Sizes) else v for k, v in kwargs.items()}
        with host_moves_kept() if sized else contextlib.nullcontext():
            result = function(*args, **kwargs)
        if not copies:
            return result
        for name, copy in copies.items():
            if kinds(copy) != made[name]:
                raise StateChanged(f"{name}: its structure changed in the call")
        return result, {name: written(given[name], copy) for name, copy in copies.items()}

    return call


def written_back(result, held: dict):
    """A lifted call's result, with the slots it wrote written into each state
    argument."""
    if not held:
        return result
    result, slots = result
    for name, target in held.items():
        write(target, slots[name])
    return result


# ------------------------------------------------------------------------- sizes

@dataclass(frozen=True)
class Sizes:
    """Sizes as a static argument: their values, and what they were given as (an
    integer tensor's dimensions and dtype; a list's, None). No field is named ``shape``
    or ``dtype``: JAX's export takes an argument with those for an array."""

    values: tuple
    dims: tuple | None = None
    number: str | None = None

    def given(self):
        """The sizes as the call was given them, inside the program: a list, or a tensor
        on the host (not a value of the program: ``.item()`` reads it)."""
        if self.dims is None:
            return list(self.values)
        import numpy as np
        import torch

        return torch.from_numpy(np.asarray(self.values, dtype=self.number).reshape(self.dims))


def is_sizes(value) -> bool:
    """An integer tensor on the host small enough to be sizes, not data; or a list of
    as few integers."""
    import torch

    if type(value) is list:
        return 0 < len(value) <= SMALL and all(type(v) is int for v in value)
    return (type(value) is torch.Tensor and value.device.type == "cpu"
            and not value.is_floating_point() and not value.is_complex()
            and value.numel() <= SMALL)


def sizes_of(value) -> Sizes:
    """``value`` (``is_sizes``) as a static argument."""
    if type(value) is list:
        return Sizes(tuple(value))
    return Sizes(tuple(value.flatten().tolist()), tuple(value.shape), str(value.numpy().dtype))


def as_sizes(kwargs: dict) -> dict:
    """``kwargs`` with each of its sizes (top level) static (``Sizes``)."""
    return {k: sizes_of(v) if is_sizes(v) else v for k, v in kwargs.items()}


@contextlib.contextmanager
def host_moves_kept():
    """While a call with sizes is traced: a host tensor the model moves to the device
    (``table.to(device)``, with a dtype or without) is a constant the trace holds, as
    the host tensor was, not a value computed in the program. A model that keeps what
    it moved for its next call (Wan-Animate-2's rotary tables, by the sizes they were
    made for) then keeps that constant, where a value of one program would be a tracer
    left over in the next one's trace. Nothing larger than what the model already made
    on the host. Nests (a sized call traced inside another); not for two threads
    tracing at once."""
    import jax
    import torch

    env = import_torchax().default_env()
    before = vars(env).get("_to_copy")
    copy = env._to_copy

    def _to_copy(tensor, dtype, device):
        if type(tensor) is not torch.Tensor:  # torchax's own (or a view): as ever
            return copy(tensor, dtype, device)
        with jax.ensure_compile_time_eval():
            return copy(tensor, dtype, device)

    env._to_copy = _to_copy
    try:
        yield
    finally:
        if before is None:
            del env._to_copy
        else:
            env._to_copy = before
