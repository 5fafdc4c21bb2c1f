"""What a pipeline hands a compiled call besides tensors and plain values, made
traceable (``porter.transforms.jit.autosplit`` applies both):

- Objects the call writes (``is_state``): an argument that is an object holding
  tensors and nothing else (through lists, tuples and objects of its kind; a slot may
  be None, not written yet), such as Wan-Animate-2's key/value cache, which its
  reference pass fills and each step reads. Held as a static argument (by identity)
  a new object would make a new program (a segment each) and a traced call's writes
  would leave tracers in it. It goes in as its tensors instead (``values``: a tree of
  dicts and lists, its classes a static argument), the call runs on a copy made of
  them (``build``), and what the call left in the copy comes out beside the result and
  is written back into the caller's object (``write``).
- Sizes (``Sizes``): an integer tensor of at most 16 numbers that the pipeline made
  on the host (a grid's sizes, as the dry run keeps them), or a list of integers
  (Wan-Animate-2's ``origin_area=[height, width]``, which would go in as traced
  numbers, a list being no static argument), goes in as its values, static, and
  what the call computes from such values alone is computed while it is traced
  (``folded``: JAX's eager constant folding), so ``grid[0][2].item()`` and
  ``grid.tolist()`` read numbers. Only for a call that cannot be traced otherwise:
  a pipeline's integer timestep is such a tensor too, and a program per step would
  cost more than it saves.
"""

from __future__ import annotations

from dataclasses import dataclass

from porter.shims.compat import import_torchax

#: integer tensors this small are sizes, not data (the dry run's bound too)
SMALL = 16
#: the static argument that carries a state argument's classes: this prefix + its name
KINDS = "_porter_kinds_"


# ------------------------------------------------------------------ objects written

def is_state(value) -> bool:
    """An object (compared by identity, not a module or tensor) whose attributes hold
    tensors and None alone, through lists, tuples and objects of its kind, with at
    least one such slot."""
    import torch

    if not _object(value):
        return False
    slots = []

    def walk(v) -> bool:
        if v is None or isinstance(v, torch.Tensor):
            slots.append(v)
            return True
        if isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):
            return all(walk(x) for x in v)
        return _object(v) and all(walk(x) for x in vars(v).values())

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
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_kinds(v) for v in value))
    if _object(value):
        return (type(value), tuple((name, _kinds(v)) for name, v in vars(value).items()))
    return None  # a slot: a tensor or None


def values(value):
    """A state argument as a tree JAX and PyTorch both walk: an object as a dict of its
    attributes, a list or tuple as a list, a slot as itself."""
    if isinstance(value, (list, tuple)):
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


def write(target, tree) -> None:
    """``tree`` (what a call left in its copy of ``target``) into ``target``, in place:
    the caller's object, and every list of it, is the one it holds."""
    for name, value in tree.items():
        setattr(target, name, _written(getattr(target, name), value))


def _written(current, value):
    if isinstance(value, dict):
        write(current, value)
        return current
    if isinstance(value, list):
        parts = [_written(c, v) for c, v in zip(current, value)]
        if isinstance(current, list):
            current[:] = parts
            return current
        return tuple(parts)
    return value


class StateChanged(Exception):
    """A call changed a state argument's structure (added an attribute, grew a list):
    only its slots can come back out of a program."""


def lift(kwargs: dict) -> tuple[dict, dict]:
    """(``kwargs`` with each state argument as its ``values`` and its ``kinds`` beside it
    as a static argument, the state arguments by name)."""
    held = {name: v for name, v in kwargs.items() if is_state(v)}
    if not held:
        return kwargs, held
    lifted = {**kwargs}
    for name, value in held.items():
        lifted[name] = values(value)
        lifted[KINDS + name] = kinds(value)
    return lifted, held


def lifted(function, sized: bool = False):
    """``function`` taking lifted state arguments (``lift``) and giving back, beside its
    result, what it left in each (a dict by name; only when it took any); ``sized``: it
    takes ``Sizes`` and computes from constants while it is traced (``folded``)."""

    def call(*args, **kwargs):
        if not sized:
            return _called(*args, **kwargs)
        with folded():
            return _called(*args, **kwargs)

    def _called(*args, **kwargs):
        made = {name[len(KINDS):]: kwargs.pop(name) for name in list(kwargs)
                if name.startswith(KINDS)}
        copies = {name: build(kind, kwargs[name]) for name, kind in made.items()}
        kwargs.update(copies)
        kwargs = {k: v.given() if isinstance(v, Sizes) else v for k, v in kwargs.items()}
        result = function(*args, **kwargs)
        if not copies:
            return result
        for name, copy in copies.items():
            if kinds(copy) != made[name]:
                raise StateChanged(f"{name}: its structure changed in the call")
        return result, {name: values(copy) for name, copy in copies.items()}

    return call


def written_back(result, held: dict):
    """A lifted call's result, with what it left in each state argument written back."""
    if not held:
        return result
    result, left = result
    for name, target in held.items():
        write(target, left[name])
    return result


# ------------------------------------------------------------------------- sizes

@dataclass(frozen=True)
class Sizes:
    """Sizes as a static argument: their values, and what they were given as (an
    integer tensor's shape and dtype; a list's, None)."""

    values: tuple
    shape: tuple | None = None
    dtype: str | None = None

    def given(self):
        """The sizes as the call was given them, inside the program: a list, or a
        tensor that is a constant tracing reads (under ``folded``)."""
        if self.shape is None:
            return list(self.values)
        import jax.numpy as jnp
        import numpy as np

        interop = import_torchax().interop
        return interop.torch_view(jnp.asarray(
            np.asarray(self.values, dtype=self.dtype).reshape(self.shape)))


def is_sizes(value) -> bool:
    """An integer tensor on the host small enough to be sizes, not data; or a list of
    integers."""
    import torch

    if type(value) is list:
        return all(type(v) is int for v in value)
    return (type(value) is torch.Tensor and value.device.type == "cpu"
            and not value.is_floating_point() and not value.is_complex()
            and value.numel() <= SMALL)


def _sizes(value) -> Sizes:
    if type(value) is list:
        return Sizes(tuple(value))
    return Sizes(tuple(value.flatten().tolist()), tuple(value.shape), str(value.numpy().dtype))


def as_sizes(kwargs: dict) -> dict:
    """``kwargs`` with each of its sizes (top level) static (``Sizes``)."""
    return {k: _sizes(v) if is_sizes(v) else v for k, v in kwargs.items()}


def folded():
    """What is computed from constants alone computed while tracing, not staged."""
    import jax

    return jax.ensure_compile_time_eval()
