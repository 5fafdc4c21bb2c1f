"""Compiled calls that need no hand-written boundaries.

Static arguments: a call's arguments that hold no tensor (``return_dict=False``,
``num_frames=9``, ``enable_temporal_attentions=True``, a tuple of floats) are
passed to ``jax.jit`` as static, so Python in the model may branch on them. One
program per distinct set of values, as ``static_argnames`` gives; the recipe's
``static_argnames`` are static always.

Objects a call writes and sizes made on the host (``porter.transforms.jit.lifting``):
an argument that is an object holding tensors alone (a key/value cache) goes in as
its tensors and comes back out written; a call that cannot be traced otherwise is
traced again with its small host integer tensors (a grid's sizes) as constants, and
compiled whole if that traces (remembered, as a split is).

Automatic split: when a component (or any module below it) cannot be traced —
Python that needs a tensor's value, ``torch.nonzero``, ``.item()`` — its first
call falls back to running that module eagerly, with each child module that
holds weights compiled on its own, and so on down the module tree: the largest
pieces that trace are compiled, the glue between them runs op by op. What ran
eagerly and why (the file:line of the untraceable code) is said once, kept for
the run record, and stored next to the traced programs so the next run goes
straight to the split without tracing what failed before.
"""

from __future__ import annotations

import functools
import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path

from porter.errors import Interrupted
from porter.runtime import atomic, distributed, notices, trace_context
from porter.shims import fixes as torchax_fixes
from porter.shims.compat import import_torchax
from porter.shims.tracing import model_frame, untraceable
import porter.transforms.jit.lifting as lifting  # not the package: it imports this


def holds_tensor(value) -> bool:
    import torch
    from torch.utils import _pytree

    return any(isinstance(leaf, torch.Tensor) for leaf in _pytree.tree_leaves(value))


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def as_keywords(function, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Positional arguments named by ``function``'s signature (``self`` excluded), so
    each can be static by name; left as they are when the signature takes ``*args``
    or does not bind them."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return args, kwargs
    parameters = list(signature.parameters.values())[1:]  # self
    if any(p.kind in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY) for p in parameters):
        return args, kwargs
    if len(args) > len(parameters):
        return args, kwargs
    named = dict(zip((p.name for p in parameters), args))
    if set(named) & set(kwargs):
        return args, kwargs  # a bad call: let the model say so
    return (), {**named, **kwargs}


def static_names(kwargs: dict) -> tuple[str, ...]:
    """The keyword arguments that hold no tensor and can be hashed: static (but an
    object the call writes, which ``programs`` lifts into an input)."""
    return tuple(sorted(k for k, v in kwargs.items()
                        if not holds_tensor(v) and _hashable(v)))


@dataclass
class Split:
    """What an automatic split of one compiled component did: module path -> why it
    ran eagerly ("" is the component itself), and the paths compiled below it; with
    how its pieces are compiled (``traces``, a TraceCache or None, and jax.jit's
    arguments)."""
    component: str
    store: Path | None = None  # where the split is remembered (None: not kept)
    traces: object = None
    jit_kwargs: dict = field(default_factory=dict)
    eager: dict[str, str] = field(default_factory=dict)
    compiled: set[str] = field(default_factory=set)
    #: calls compiled whole with their sizes as constants (``lifting.Sizes``)
    sized: set[str] = field(default_factory=set)

    @classmethod
    def remembered(cls, component: str, traces, jit_kwargs: dict) -> "Split":
        """The split of ``component``, as an earlier run kept it in ``traces``."""
        store = traces.split_store(component) if traces is not None else None
        split = cls(component, store, traces, jit_kwargs)
        if store is not None:
            try:
                kept = json.loads(store.read_text())
                split.eager = dict(kept["eager"])
                split.sized = set(kept.get("sized", ()))
            except (OSError, ValueError, KeyError, TypeError):
                pass  # nothing kept yet, or unreadable: search again
        return split

    def failed(self, path: str, exc: BaseException) -> None:

        where = model_frame(exc)
        reason = type(exc).__name__ + (f" at {where}" if where else "")
        self.eager[path] = reason
        notices.warn(f"{self.label(path)} cannot be compiled whole ({reason}): it runs "
                     "eagerly, with its submodules that hold weights compiled one by one",
                     hint=f"compile.{self.component}.modules names the pieces by hand; a "
                          "patch for the untraceable function compiles it whole again")
        self._keep()

    def traced_with_sizes(self, key: str) -> None:
        self.sized.add(key)
        self._keep()

    def label(self, path: str) -> str:
        return f"{self.component}.{path}" if path else self.component

    def report(self) -> dict | None:
        """What ran eagerly and why, what was compiled, and what compiled whole only
        with its sizes as constants; None for a component compiled whole as it is."""
        if not self.eager and not self.sized:
            return None
        found = {"eager": dict(self.eager), "compiled": sorted(self.compiled)}
        return {**found, "sized": sorted(self.sized)} if self.sized else found

    def _keep(self) -> None:

        if self.store is None or not distributed.writes():
            return
        try:
            self.store.parent.mkdir(parents=True, exist_ok=True)
            atomic.write_bytes(self.store, json.dumps(
                {"eager": self.eager, "sized": sorted(self.sized)}).encode())
        except OSError:
            pass  # only a shortcut for the next run: the trace cache warns about its dir


def programs(function, name: str, split: Split):
    """``program(static)``: ``function`` (taking and returning torch tensors) jitted
    with the argument names ``static`` static besides the recipe's, one program per
    set of names, trace-cached as ``name`` where the split has a trace cache; the
    objects it writes and its ``Sizes`` lifted (``lifting``)."""
    import jax

    traces, jit_kwargs = split.traces, split.jit_kwargs
    interop = import_torchax().interop
    made: dict = {}
    runs: dict = {}

    def jitted(static: tuple[str, ...]):
        # state that changes what is traced (a windowed video's grid, its dense steps)
        # makes another program of the same shapes
        key = (static, trace_context.key())
        if key not in made:
            options = {**jit_kwargs, "static_argnames": tuple(
                sorted(set(jit_kwargs.get("static_argnames", ())) | set(static)))}
            named = name + trace_context.label(key[1])
            jit = functools.partial(traces.jit, named) if traces is not None else jax.jit
            made[key] = interop.wrap_jax_jit(lifting.lifted(function), jax_jit_func=jit,
                                             kwargs_for_jax=options)
        return made[key]

    def program(static: tuple[str, ...]):
        # one call for the same names in one trace context, as one program (the calls
        # differ in nothing else: each picks its program when it runs)
        key = (static, trace_context.key())
        if key not in runs:
            def run(*args, **kwargs):
                kwargs, held = lifting.lift(kwargs)
                names = (*(n for n in static if n not in held),
                         *(lifting.KINDS + name for name in sorted(held)))
                return lifting.written_back(jitted(names)(*args, **kwargs), held)
            runs[key] = run
        return runs[key]
    return program


def split_children(module, prefix: str, split: Split) -> None:
    """Compile, in place, each child of ``module`` that holds weights (through
    containers such as ``ModuleList``); the rest runs eagerly inside its parent."""
    import torch

    for name, child in module.named_children():
        path = f"{prefix}.{name}" if prefix else name
        has_forward = type(child).forward is not torch.nn.Module.forward
        if not has_forward:  # ModuleList, ModuleDict: a container, not a call
            split_children(child, path, split)
        elif next(child.parameters(), None) is not None or \
                next(child.buffers(), None) is not None:
            compile_in_place(child, path, split)


def compile_in_place(module, path: str, split: Split) -> None:
    """``module.forward`` becomes a compiled call of the module's own forward, with
    the tensors the module holds at call time as inputs (so a parent's
    reparametrization reaches it); if it cannot be traced, ``split_children``."""
    forward = type(module).forward

    def functional(state, *args, **kwargs):
        from torch.nn.utils import stateless
        with stateless._reparametrize_module(module, state):
            return forward(module, *args, **kwargs)

    program = programs(functional, f"{split.component}.{path}.forward", split)

    def traced(static, *args, **kwargs):
        state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
        return program(static)(state, *args, **kwargs)

    module.forward = splitting_call(
        module, path, split, signature_of=forward, traced=traced,
        eager=functools.partial(forward, module))


def splitting_call(module, path: str, split: Split, *, signature_of, traced, eager,
                   key: str | None = None):
    """The call that replaces a compiled method: ``traced(static_names, *args,
    **kwargs)`` (arguments named by ``signature_of``'s signature where it allows) until
    a call proves it untraceable, then, and from then on, ``eager(*args, **kwargs)``
    with ``module``'s children compiled one by one. Before giving up, a call that takes
    sizes made on the host is traced again with them as constants (``lifting``); what
    traces so is remembered. A split remembered from an earlier run is made at once.
    ``key`` (default: ``path``) is what the split remembers the failure by: one per
    compiled method of a component, so that a VAE's untraceable ``_encode`` leaves its
    ``decode`` whole."""
    key = path if key is None else key

    def run(args, kwargs):
        # a tensor the pipeline made on the host (no device given) crosses in here
        args, kwargs = torchax_fixes.on_device((args, kwargs))
        return traced(static_names(kwargs), *args, **kwargs)

    def attempt(args, kwargs):
        if key in split.sized:
            return run(args, lifting.as_sizes(kwargs))
        try:
            return run(args, kwargs)
        except untraceable() as exc:
            if not any(map(lifting.is_sizes, kwargs.values())):
                raise
            first = exc
        try:
            result = run(args, lifting.as_sizes(kwargs))
        except Interrupted:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the retry: it splits
            raise first from exc
        split.traced_with_sizes(key)
        return result

    def call(*args, **kwargs):
        if key not in split.eager:
            named_args, named_kwargs = as_keywords(signature_of, args, kwargs)
            try:
                result = attempt(named_args, named_kwargs)
            except (*untraceable(), lifting.StateChanged) as exc:
                split.failed(key, exc)
                split_children(module, path, split)
            else:
                split.compiled.add(key)
                return result
        args, kwargs = torchax_fixes.on_device((args, kwargs))
        return eager(*args, **kwargs)

    if key in split.eager:
        split_children(module, path, split)
    return call
