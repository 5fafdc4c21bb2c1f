"""The programs a pipeline's own call runs (a generic or modular pipeline, whose family
declares none: ``ModelFamily.programs``), found by running that call once with every
component abstract.

The pipeline is built from the checkpoint's files as a run builds it, with the abstract
port's components (meta modules: configurations, no weights) in place of its torch
modules. Its own ``__call__`` then runs on the host as a run calls it (tokenizers,
schedulers, the loop, the post-processing all real), while each component call is
recorded (component, method, the shapes and dtypes of its inputs, how often) and
answered by the module itself run on PyTorch's meta device, shapes only, its outputs
zeros of those shapes. What the pipeline reads of a module's buffers itself (a VAE's
latent statistics) it reads as ones on the host. A call that a run makes eagerly (a
component's the recipe does not compile, a child's a pipeline calls itself: no program
of its own, its outputs' shapes are all that matter) may ask a yes-or-no question of a tensor
(``padding_mask.all()``, transformers' attention masks): on the meta device the answer
is yes; a compiled call is told that it is traced, as the compile tells it. The calls
of compiled methods are the programs ``porter compile`` lowers; nothing is computed at
the model's size.

What it cannot do: a pipeline or model that needs values the zeros do not give (a
branch on a tensor inside a model's forward, which meta tensors cannot answer) stops
with the reason; ``porter compile`` reports its components as left out.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.utils import _pytree as pytree

from porter import loading
from porter.aot.programs import Program, described, unique
from porter.errors import UsageError
from porter.families.base import takes_frames
from porter.loading import published
from porter.recipe.sources import source_kind
from porter.shims.attributes import replaced
from porter.transforms import jit, patches
from porter.transforms.jit import lifting

if TYPE_CHECKING:
    from porter.aot.port import AbstractPort
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe

#: the methods a pipeline calls on its components, answered wherever a module has them
#: (a VAE's encode runs in the dry run though only its decode is compiled)
ENTRIES = ("forward", "encode", "decode")

#: integer inputs this small keep their values on the meta run (sizes, not data:
#: ``lifting.is_sizes``, as a compiled call that needs them takes them)
SMALL = lifting.SMALL

#: the stage a component's calls belong to (others: encode)
DECODE = {("vae", "decode"), ("vae", "decode_chunk"), ("audio_vae", "decode"),
          ("vocoder", "forward"), ("diffusion_decoder", "decode")}


def programs(port: AbstractPort, eager: set | None = None) -> list[Program]:
    """The calls of compiled methods one video makes, in call order, merged by
    signature (``calls``: how many), with their stages and calls per step. ``eager``
    gets the stages of the calls a run makes eagerly of a compiled component (a
    method its rule does not name, a child the pipeline calls itself)."""
    recipe = port.recipe
    modules = {name: c.module for name, c in port.components.items()}
    compiled = {name: c.rule for name, c in port.components.items() if c.rule is not None}
    pipe = _pipeline(port, modules)
    functions = {name: own for name, own in port.family.compiled_functions.items()
                 if name in compiled}  # compiled methods of the module where it is
    with patches.applied(port.ported.patches), _on_the_host(pipe), _meta_autocast(), \
            _answered(modules, compiled, functions) as calls:
        made, given = _generated(port.family, pipe, recipe, calls)
    _first_chunk(calls)
    steps = recipe.generate.steps
    found = []
    for program in unique(calls):
        if program.component not in compiled \
                or (program.method not in compiled[program.component].methods
                    and program.method not in functions.get(program.component, {})):
            if eager is not None and program.component in compiled:
                eager.add(_stage(port, program))  # a compiled component's other call
            continue  # run eagerly: no program of its own (a VAE's encode, where a
            # recipe compiles only its decode; MiniMax-H3's text encoder's ``.model``)
        program.stage = _stage(port, program)
        if program.stage == "denoise" and steps and program.calls:
            # a step's calls on average: MiniMax-H3's schedule counts its final sigma
            # as a step (49 calls in 50 steps), a first call may differ from the rest
            program.per_step = program.calls // steps if program.calls % steps == 0 \
                else program.calls / steps
        if program.stage == "decode" and made.frames is not None:
            program.frames = len(made.frames) - given
        found.append(program)
    return found


def _generated(family: ModelFamily, pipe, recipe: Recipe, calls: list[Program]):
    """The family's call of the pipeline as a run with a stream makes it: frames taken
    as they come (``output.stream``), so that a pipeline that finishes its chunks is
    decoded chunk by chunk here too (``porter.families.chunked``). With the frames
    handed on before any decode call (``calls``, as they are recorded): those the video
    begins with from the pipeline's input (video-to-video), which no call makes."""
    if not (recipe.output.streams and takes_frames(family)):
        return family.generate(pipe, recipe), 0
    given = 0

    def taken(frames):
        nonlocal given
        if not any((call.component, call.method) in DECODE for call in calls):
            given += len(frames)

    return family.generate(pipe, recipe, on_frames=taken), given


def _first_chunk(calls: list[Program]) -> None:
    """Each call marked as made before the video's first decode (1) or after (0)."""
    before = 1
    for call in calls:
        if (call.component, call.method) in DECODE:
            before = 0
        call.first_chunk = before


def _stage(port: AbstractPort, program: Program) -> str:
    if (program.component, program.method) in DECODE:
        return "decode"
    return stage_of(port.family, program.component)


def stage_of(family: ModelFamily, component: str) -> str:
    """The stage of a component's calls other than those ``DECODE`` names."""
    if component in family.stepped_transformers or component.startswith("transformer"):
        return "denoise"
    return "encode"


def _pipeline(port: AbstractPort, modules: dict):
    """The recipe's pipeline class built from the checkpoint's files around ``modules``
    (its tokenizers, schedulers and processors real)."""
    recipe, family = port.recipe, port.family
    source = recipe.model.source
    kind = source_kind(source)
    root = None
    if kind == "local":
        root = Path(source).expanduser()
    elif kind == "hub":  # the snapshot in the local cache, else the layout Porter ships
        root = _cached(source)
        if root is None and (root := published.layout(source)) is not None:
            _stand_ins()
    if root is None:
        raise UsageError(f"cannot find the calls of {source!r} without its files",
                         hint="point model.source at a local diffusers directory (its "
                         "configuration, tokenizer and scheduler files are enough)")
    torch_modules = {name: module for name, module in modules.items()
                     if isinstance(module, torch.nn.Module)}
    return loading.from_pretrained(family.pipeline_class(recipe), root, torch.float32,
                                   source, torch_modules)


def _stand_ins() -> None:
    """The classes a shipped layout names in place of real ones, imported so diffusers
    can load them (it resolves a library it does not know from the imported modules);
    a transformers without Qwen3-VL leaves them out, and only MiniMax-H3's layout
    needs them."""
    try:
        from porter.loading import standins  # noqa: F401  # lazy: transformers' processors
    except ImportError:
        pass


def _cached(source: str) -> Path | None:
    """Hub id ``source``'s snapshot in the local Hugging Face cache, if there is one."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(source, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, or no such repository
        return None


@contextlib.contextmanager
def _on_the_host(pipe):
    """The pipeline makes its tensors on the host: its execution device is the CPU,
    not its meta modules' device."""
    cls = type(pipe)
    host = property(lambda self: torch.device("cpu"))
    pipe.__class__ = type(cls.__name__, (cls,), {"_execution_device": host, "device": host,
                                                 "__module__": cls.__module__})
    try:
        yield
    finally:
        pipe.__class__ = cls


@contextlib.contextmanager
def _meta_autocast():
    """``torch.autocast`` taking the meta device as the host: a model that turns
    autocast off around a part on its inputs' device (Helios's rotary tables) asks it of
    the meta device here, which has no autocast of its own."""

    class Autocast(torch.autocast):
        def __init__(self, device_type, *args, **kwargs):
            super().__init__("cpu" if device_type == "meta" else device_type,
                             *args, **kwargs)

    with replaced(torch, "autocast", Autocast):
        yield


@contextlib.contextmanager
def _answered(modules: dict, compiled: dict, functions: dict):
    """Each component's calls recorded (as ``Program``s, in the list this yields) and
    answered from shapes alone: the module runs on the meta device, once for each
    signature (a step's call is the previous step's, shape for shape), its outputs
    zeros on the host. ``functions`` (component -> name -> ``function(module, ...)``)
    are methods of the module for the call, as a run compiles them. Everything is put
    back however the call ends."""
    calls: list[Program] = []
    answers: dict = {}  # signature -> the meta outputs
    inside = []  # the call being answered: a module's calls of its own methods are its own
    with contextlib.ExitStack() as stack:
        for name, module in modules.items():
            if not isinstance(module, torch.nn.Module):
                continue
            buffers = _Buffers(module)
            stack.callback(buffers.restore)
            stack.callback(_cached_on(module))
            own = functions.get(name, {})
            for method, function in own.items():
                stack.enter_context(replaced(module, method,
                                             functools.partial(function, module)))
            rule = compiled.get(name)
            programs = {*own, *(jit.present(module, rule.methods) if rule else ())}
            for owner, method, label in _entries(module, rule) \
                    + [(module, method, method) for method in own]:
                original = getattr(owner, method)

                @functools.wraps(original)  # its signature, which pipelines read
                def answer(*args, _original=original, _name=name, _method=label,
                           _buffers=buffers, _traced=label in programs,
                           _answer=_read_zeros if label in own else _zeros, **kwargs):
                    if inside:  # e.g. a VAE's forward calling its own encode
                        return _original(*args, **kwargs)
                    call = Program(_name, _method, described(args), described(kwargs))
                    calls.append(call)
                    # the values of small integers too: a grid's sizes can shape the output
                    key = _hashable((call.signature(), _small_values((args, kwargs))))
                    # objects the call writes (a cache) get its writes, answered or not
                    held = [v for v in (*args, *kwargs.values()) if lifting.is_state(v)]
                    if key is None or key not in answers:
                        before = [lifting.snapshot(state) for state in held]
                        kinds = [lifting.kinds(state) for state in held]
                        known = _Known(guess=not _traced)
                        inside.append(call)
                        try:
                            with torch.no_grad(), _buffers.on_meta(), _as_traced(_traced):
                                args_, kwargs_ = _meta(args, known), _meta(kwargs, known)
                                with known:
                                    made = _original(*args_, **kwargs_)
                        finally:
                            inside.pop()
                        writes = [lifting.written(b, state) for b, state in zip(before, held)]
                        # a call that changed an object's structure (a run splits it):
                        # its writes fit no object of the old one, so not kept
                        if key is None or kinds != [lifting.kinds(s) for s in held]:
                            return _answer(made)
                        answers[key] = made, writes
                    made, writes = answers[key]
                    for state, slots in zip(held, writes):  # the next segment's new cache
                        lifting.write(state, slots)
                    return _answer(made)

                stack.enter_context(replaced(owner, method, answer))
        yield calls


@contextlib.contextmanager
def _as_traced(compiled: bool):
    """A compiled component's meta run stands for its trace: transformers, which asks
    before reading a mask's values whether JAX is tracing the tensor
    (``is_jax_jitting``: a torchax tensor holding a tracer) and then builds the mask
    without reading them, is told yes of a meta tensor, as the compile tells it of a
    tracer (a language model's text encoder: ``padding_mask.all()`` skipped). A call
    that runs eagerly in a run asks as it would there."""
    if not compiled:
        yield
        return
    from transformers.utils import import_utils

    original = import_utils.is_jax_jitting

    def is_jax_jitting(x):
        return (isinstance(x, torch.Tensor) and x.device.type == "meta") or original(x)

    with replaced(import_utils, "is_jax_jitting", is_jax_jitting):
        yield


def _entries(module: torch.nn.Module, rule) -> list[tuple[torch.nn.Module, str, str]]:
    """Where a pipeline enters ``module``: (object, method, the call's name). Its entry
    methods and those its compile rule names, and its children's forwards (MiniMax-H3
    calls its text encoder's ``.model``: a run runs such a call eagerly, even where the
    component's own ``forward`` is compiled). The wrapper of a compiled method
    (``encode`` around ``_encode``) is no entry: it runs, as in a run, around its
    compiled call."""
    compiled = jit.present(module, rule.methods) if rule is not None else []
    methods = {*(m for m in ENTRIES if callable(getattr(module, m, None))), *compiled} \
        - set(jit.wrappers(module, compiled))
    found = [(module, method, method) for method in sorted(methods)]
    return found + [(child, "forward", f"{child_name}.forward")
                    for child_name, child in module.named_children()]


def _hashable(signature: tuple):
    """``signature`` where it can key a dict (None where a static argument cannot)."""
    try:
        hash(signature)
    except TypeError:
        return None
    return signature


#: changes in place that do not end in an underscore
INPLACE = {torch.Tensor.__setitem__, torch.Tensor.__iadd__, torch.Tensor.__isub__,
           torch.Tensor.__imul__, torch.Tensor.__itruediv__, torch.Tensor.__ifloordiv__}

#: how a tensor's value reaches Python
READS = {torch.Tensor.__bool__: bool, torch.Tensor.item: lambda t: t.item(),
         torch.Tensor.__int__: int, torch.Tensor.__index__: int,
         torch.Tensor.tolist: lambda t: t.tolist()}


class _Known(torch.overrides.TorchFunctionMode):
    """Python reading a meta tensor's value: the value where it is known, computed
    beside the meta one from small integer inputs (``grid[0][2].item()``); otherwise,
    with ``guess``, a boolean's answer is yes (``bool(mask.all())`` in a call a run
    makes eagerly, whose outputs' shapes are all that matter)."""

    def __init__(self, guess: bool):
        super().__init__()
        self.guess = guess
        self.values: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def remember(self, meta: torch.Tensor, value) -> None:
        if isinstance(value, torch.Tensor) and value.device.type != "meta":
            self.values[id(meta)] = (meta, value)  # the meta tensor kept: its id stays its

    def _value(self, tensor):
        entry = self.values.get(id(tensor))
        return entry[1] if entry is not None and entry[0] is tensor else None

    def _on_host(self, tensor):
        value = self._value(tensor)
        return tensor if value is None else value

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        first = args[0] if args else None
        if func in READS and isinstance(first, torch.Tensor) and first.device.type == "meta":
            value = self._value(first)
            if value is not None:
                return READS[func](value)
            if self.guess and first.dtype == torch.bool and first.numel() == 1:
                return True
        made = func(*args, **kwargs)
        leaves = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        known = all(self._value(t) is not None for t in leaves)  # True with no tensors
        name = getattr(func, "__name__", "")
        if func in INPLACE or (name.endswith("_") and not name.endswith("__")):  # add_
            target = first if isinstance(first, torch.Tensor) else None
            if target is not None and self._value(target) is not None:
                if known:  # the same change on its value (which is this call's own copy)
                    on_host = pytree.tree_map_only(torch.Tensor, self._on_host, (args, kwargs))
                    func(*on_host[0], **on_host[1])
                else:
                    self.values.pop(id(target), None)  # no longer known
            return made
        if isinstance(made, torch.Tensor) and made.device.type == "meta" \
                and made.numel() <= SMALL and known \
                and (leaves or func in (torch.tensor, torch.as_tensor)):
            on_host = pytree.tree_map_only(torch.Tensor, self._on_host, (args, kwargs))
            if func in (torch.tensor, torch.as_tensor):  # sizes made from numbers
                on_host[1]["device"] = "cpu"
            self.remember(made, func(*on_host[0], **on_host[1]))
        return made


class _Buffers:
    """A meta module's buffers as ones on the host, for the pipeline to read, and on
    the meta device again while the module itself runs."""

    def __init__(self, module: torch.nn.Module):
        self.found = [(sub, name, buffer, torch.ones(buffer.shape, dtype=buffer.dtype))
                      for sub in module.modules()
                      for name, buffer in sub._buffers.items()
                      if buffer is not None and buffer.device.type == "meta"]
        self._set(host=True)

    def _set(self, host: bool) -> None:
        for sub, name, meta, ones in self.found:
            sub._buffers[name] = ones if host else meta

    @contextlib.contextmanager
    def on_meta(self):
        self._set(host=False)
        try:
            yield
        finally:
            self._set(host=True)

    def restore(self) -> None:
        self._set(host=False)


def _cached_on(module: torch.nn.Module):
    """What puts back what ``module``'s code caches on its modules (a dict or list
    attribute: Wan-Animate-2's rotary tables and block masks, by the sizes they were
    made for): the meta run fills them with meta tensors, which the compile, tracing
    the same module, would take for the tables themselves. Such attributes (and
    tensors) the meta run added are taken away again."""
    subs = list(module.modules())
    names = [set(vars(sub)) for sub in subs]
    kept = [(sub, name, value, type(value)(value)) for sub in subs
            for name, value in vars(sub).items()
            if type(value) in (dict, list) and not name.startswith("_")]

    def restore() -> None:
        for sub, name, value, contents in kept:  # the same object: others may hold it
            value.clear()
            value.extend(contents) if type(value) is list else value.update(contents)
            vars(sub)[name] = value
        for sub, had in zip(subs, names):  # caches made by the meta run itself
            for name in set(vars(sub)) - had:
                made = vars(sub)[name]
                if type(made) in (dict, list) or isinstance(made, torch.Tensor):
                    del vars(sub)[name]
    return restore


def _small_values(value) -> tuple:
    """The values of the small integer tensors in ``value``, in order."""
    return tuple(tuple(leaf.flatten().tolist()) for leaf in pytree.tree_leaves(value)
                 if lifting.is_sizes(leaf))


def _meta(value, known: _Known):
    """Host tensors as empty ones on the meta device, in any structure; the values of
    a few integers (a grid's sizes, which a model reads with ``.item()``) ``known``."""
    if isinstance(value, torch.Tensor):
        made = torch.empty(value.shape, dtype=value.dtype, device="meta")
        if lifting.is_sizes(value):
            known.remember(made, value.clone())  # the pipeline's own tensor left alone
        return made
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_meta(v, known) for v in value)
    if isinstance(value, dict) and type(value) is dict:
        return {k: _meta(v, known) for k, v in value.items()}
    return value


def _read_zeros(value):
    """``_zeros`` for what a family's compiled function returns (``functions``: a
    streamed decode's frames and its cache, FAR's cache and prediction), which is read
    (passed on, concatenated, postprocessed, stepped) and never written in place: each
    tensor one zero broadcast to its shape, no memory. AnyFlow FAR's cache at 14B and
    480p is 11.8 GB, two of them alive across a cache call: past the host's memory as
    real zeros."""
    if isinstance(value, torch.Tensor):
        return torch.zeros((), dtype=value.dtype).expand(value.shape)
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_read_zeros(v) for v in value)
    return _zeros(value)


def _zeros(value):
    """Meta tensors as zeros on the host, in any structure a module returns (tuples,
    diffusers' and transformers' output classes, a VAE's latent distribution)."""
    if isinstance(value, torch.Tensor):
        return torch.zeros(value.shape, dtype=value.dtype)
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_zeros(v) for v in value)
    if isinstance(value, dict):
        made = {k: _zeros(v) for k, v in value.items()}
        return made if type(value) is dict else type(value)(**made)
    if hasattr(value, "__dict__") and not isinstance(value, (type, torch.nn.Module)) \
            and any(isinstance(v, torch.Tensor) for v in vars(value).values()):
        made = copy.copy(value)  # an object holding tensors: DiagonalGaussianDistribution
        made.__dict__.update({k: _zeros(v) for k, v in vars(value).items()})
        return made
    return value
