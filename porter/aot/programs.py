"""What a family says each compiled program of a run is called with, at a recipe's
shapes: ``Program``s of ``Input``s. ``porter compile`` lowers them with abstract values
in place of every tensor; ``recorded`` captures the same description from the calls
a real run makes, so a test holds each family's declarations to what it runs.

Inputs are described as they reach the program: a tensor's shape and the dtype it
has on a JAX device (int64 arrives as int32, float64 as float32); a value that holds
no tensor is passed as it is (a static argument, e.g. ``return_dict=False``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from dataclasses import dataclass, field

import torch

from porter.shims.interop import jax_dtype
from porter.transforms.jit import lifting


@dataclass(frozen=True)
class Input:
    """A tensor argument: its shape and its dtype on the device. A few integers made on
    the host (a grid's sizes) keep their values too (``sizes``, ``lifting.Sizes``),
    which a call that cannot be traced without them takes as constants, as a run does;
    they are not part of the program's signature (a pipeline's integer timestep is
    such a tensor, and one program serves every step)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    sizes: object = field(default=None, compare=False)

    def __repr__(self) -> str:
        return f"Input({list(self.shape)}, {str(self.dtype).removeprefix('torch.')})"


@dataclass(frozen=True, eq=False)
class State:
    """An object the call writes (``lifting.is_state``: Wan-Animate-2's key/value
    cache), as it is when called: its classes (``lifting.Kinds``) and its slots, a tree
    of dicts and lists of ``Input``s and Nones (``lifting.values``). The program takes
    the slots and gives back those it writes, as a run's does."""

    kinds: object
    tree: object

    def _key(self) -> tuple:
        return self.kinds, _frozen(self.tree)

    def __eq__(self, other) -> bool:
        return isinstance(other, State) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @property
    def name(self) -> str:
        """The object's class's name."""
        return self.kinds.tree[0].__name__

    def __repr__(self) -> str:
        return f"State({self.name}, {self.tree!r})"


@dataclass
class Program:
    """One compiled call: ``component``'s ``method`` with ``args`` and ``kwargs`` (each
    an ``Input``, a structure holding ``Input``s, or a static value), made ``calls``
    times in one video, in ``stage`` (encode, denoise or decode). A denoising step
    runs one transformer component (two experts take turns), ``per_step`` times."""

    component: str
    method: str = "forward"
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    calls: int | None = 1  # None: not known before the run (a share of the steps)
    stage: str = "denoise"
    note: str = ""  # what sets this call apart: "cond and uncond batched", "steps 1-35"
    per_step: float = 0  # denoise: calls in each step this program runs in (on average)
    #: the calls made before the video's first decode, where a dry run saw the order (a
    #: pipeline that makes its video chunk by chunk: its first chunk's share)
    first_chunk: int | None = None
    #: decode: the frames of the video its calls make, where a dry run saw the video
    frames: int | None = None

    @property
    def name(self) -> str:
        return f"{self.component}.{self.method}"

    def signature(self) -> tuple:
        """What decides the compiled program: the same signature, the same program."""
        return (self.component, self.method, _frozen(self.args), _frozen(self.kwargs))


def _frozen(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def described(value):
    """A call's argument as a declaration describes it: tensors as ``Input``s."""

    if isinstance(value, torch.Tensor):
        return Input(tuple(value.shape), jax_dtype(value.dtype),
                     lifting.sizes_of(value) if lifting.is_sizes(value) else None)
    if lifting.is_state(value):
        return State(lifting.kinds(value), described(lifting.values(value)))
    if isinstance(value, (list, tuple)):
        return type(value)(described(v) for v in value)
    if isinstance(value, dict):
        return {k: described(v) for k, v in value.items()}
    return value


def unique(programs: list[Program]) -> list[Program]:
    """Programs with distinct signatures, each with the calls of all its copies."""
    merged: dict = {}
    for program in programs:
        key = program.signature()
        if key in merged:
            merged[key].args, merged[key].kwargs = _agreed(
                (merged[key].args, merged[key].kwargs), (program.args, program.kwargs))
            known = None not in (merged[key].calls, program.calls)
            merged[key].calls = merged[key].calls + program.calls if known else None
            if None not in (merged[key].first_chunk, program.first_chunk):
                merged[key].first_chunk += program.first_chunk
        else:
            merged[key] = dataclasses.replace(program, kwargs=dict(program.kwargs))
    return list(merged.values())


def _agreed(kept, other):
    """``kept`` (a call's arguments) with the sizes (``Input.sizes``) that ``other``, a
    call of the same program, gives otherwise dropped: values that change from call to
    call (a step's timestep) are data, which a program takes as an input; sizes stay."""
    if isinstance(kept, Input):
        same = kept.sizes == getattr(other, "sizes", None)
        return kept if same else dataclasses.replace(kept, sizes=None)
    if isinstance(kept, dict):
        return {k: _agreed(v, other[k]) for k, v in kept.items()}
    if isinstance(kept, (list, tuple)) and not hasattr(kept, "_fields"):
        return type(kept)(_agreed(v, o) for v, o in zip(kept, other))
    return kept


def submodule_calls(module, pattern: str, program: Program) -> list[Program]:
    """The calls ``program`` makes of ``module``'s submodules whose names match
    ``pattern`` (a compile rule's ``modules``: each such submodule is compiled by
    itself and the code between them runs eagerly, e.g. a VAE decoder called once per
    tile by diffusers' tiled decode), as Programs of their own, named by the
    submodule's path (``vae.decoder``). Found by running ``program``'s method on
    PyTorch's meta device: shapes only, no values. Raises what that code raises where
    it needs values (a branch on a tensor)."""
    import torch

    calls: list[Program] = []

    def record(sub, args, kwargs, path):
        calls.append(Program(program.component, path, described(args), described(kwargs),
                             calls=program.calls, stage=program.stage,
                             note=f"called by {program.name}"))

    handles = [sub.register_forward_pre_hook(functools.partial(record, path=name),
                                             with_kwargs=True)
               for name, sub in outermost(module, pattern)]
    try:
        with torch.no_grad():
            getattr(module, program.method)(*_meta(program.args), **_meta(program.kwargs))
    finally:
        for handle in handles:
            handle.remove()
    return calls


def carried_calls(module, component: str, name: str, function, chunks: list,
                  cache) -> list[Program]:
    """The programs of a loop over chunks that carries a cache from call to call (a
    causal VAE's streamed decode: ``function(module, piece, cache, **kwargs)`` returns
    (output, the cache after it), compiled as ``component``'s ``name``): one per
    distinct (piece, cache, kwargs), each with its calls, for ``chunks`` (each piece's
    ``Input`` and keyword arguments) from ``cache`` (as the loop starts it). Found by
    running ``function`` on PyTorch's meta device: shapes only. Once a call leaves the
    cache as it found it, every later chunk like it is the same program."""
    import torch

    found: list[Program] = []
    index = 0
    with torch.no_grad():
        while index < len(chunks):
            piece, kwargs = chunks[index]
            before = described(cache)
            found.append(Program(component, name, (piece, before), dict(kwargs),
                                 stage="decode"))
            _, cache = function(module, _meta(piece), _meta(cache), **kwargs)
            index += 1
            if _frozen(described(cache)) == _frozen(before):  # settled: the rest alike
                while index < len(chunks) and chunks[index] == (piece, kwargs):
                    found[-1].calls += 1
                    index += 1
    return unique(found)


def outermost(module, pattern: str) -> list:
    """Submodules whose names match ``pattern``, none inside another (as a run compiles
    them: a compiled submodule's children are part of its program)."""
    found: list = []
    for name, sub in module.named_modules():
        if name and re.fullmatch(pattern, name) \
                and not any(name.startswith(f"{outer}.") for outer, _ in found):
            found.append((name, sub))
    return found


def _meta(value):
    """A declaration's ``Input``s as empty tensors on the meta device."""
    import torch

    if isinstance(value, Input):
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_meta(v) for v in value)
    if isinstance(value, dict):
        return {k: _meta(v) for k, v in value.items()}
    return value


@contextlib.contextmanager
def recorded(pipe, compiled: dict):
    """Every call of the compiled methods of ``pipe``'s components (``compiled``:
    component -> CompileRule, as a run compiles them; a family's compiled functions
    too), as ``Program``s appended to
    the list this yields, in call order."""
    calls: list[Program] = []
    undo = []
    for name in compiled:
        module = _jittable(getattr(pipe, name, None))
        if module is None:
            continue
        for method in list(module._jitted):  # its methods, and the family's functions
            original = module._jitted[method]

            @functools.wraps(original)  # the method's signature, which pipelines read
            def record(*args, _call=original, _name=name, _method=method, **kwargs):
                calls.append(Program(_name, _method, described(args), described(kwargs)))
                return _call(*args, **kwargs)

            module._jitted[method] = record
            undo.append((module, method, original))
    try:
        yield calls
    finally:
        for module, method, original in undo:
            module._jitted[method] = original


def _jittable(component):
    """The torchax JittableModule inside a ported component's wrappers, if any."""
    seen = 0
    while component is not None and seen < 4:
        if hasattr(component, "_jitted"):
            return component
        component = getattr(component, "module", None) or getattr(component, "_target", None)
        seen += 1
    return None
