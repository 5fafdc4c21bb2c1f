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
latent statistics) it reads as ones on the host. A component that is not compiled
(a text encoder: no program of its own, its outputs' shapes are all that matter) may
ask a yes-or-no question of a tensor (``padding_mask.all()``, transformers' attention
masks): on the meta device the answer is yes. The calls of compiled methods are the programs ``porter
compile`` lowers; nothing is computed at the model's size.

What it cannot do: a pipeline or model that needs values the zeros do not give (a
branch on a tensor inside a model's forward, which meta tensors cannot answer) stops
with the reason; ``porter compile`` reports its components as left out.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from porter.aot.programs import Program, described, unique
from porter import loading
from porter.errors import UsageError
from porter.loading import published
from porter.recipe.sources import source_kind
from porter.transforms import patches

if TYPE_CHECKING:
    from porter.aot.port import AbstractPort

#: the stage a component's calls belong to (others: encode)
DECODE = {("vae", "decode"), ("audio_vae", "decode"), ("vocoder", "forward"),
          ("diffusion_decoder", "decode")}


def programs(port: AbstractPort) -> list[Program]:
    """The calls of compiled methods one video makes, in call order, merged by
    signature (``calls``: how many), with their stages and calls per step."""
    recipe = port.recipe
    modules = {name: c.module for name, c in port.components.items()}
    compiled = {name: c.rule for name, c in port.components.items() if c.rule is not None}
    pipe = _pipeline(port, modules)
    with patches.applied(port.ported.patches), _on_the_host(pipe), \
            _answered(modules, compiled) as calls:
        port.family.generate(pipe, recipe)
    steps = recipe.generate.steps
    found = []
    for program in unique(calls):
        if program.component not in compiled:
            continue  # run eagerly: no program of its own
        program.stage = _stage(port, program)
        if program.stage == "denoise" and steps and program.calls % steps == 0:
            program.per_step = program.calls // steps
        found.append(program)
    return found


def _stage(port: AbstractPort, program: Program) -> str:
    if (program.component, program.method) in DECODE:
        return "decode"
    if program.component in port.family.stepped_transformers \
            or program.component.startswith("transformer"):
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
        root = _cached(source) or published.layout(source)
    if root is None:
        raise UsageError(f"cannot find the calls of {source!r} without its files",
                         hint="point model.source at a local diffusers directory (its "
                         "configuration, tokenizer and scheduler files are enough)")
    torch_modules = {name: module for name, module in modules.items()
                     if isinstance(module, torch.nn.Module)}
    return loading.from_pretrained(family.pipeline_class(recipe), root, torch.float32,
                                   source, torch_modules)


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
def _answered(modules: dict, compiled: dict):
    """Each component's calls recorded (as ``Program``s, in the list this yields) and
    answered from shapes alone: the module runs on the meta device, once for each
    signature (a step's call is the previous step's, shape for shape), its outputs
    zeros on the host. Everything is put back however the call ends."""
    calls: list[Program] = []
    answers: dict = {}  # signature -> the meta outputs
    with contextlib.ExitStack() as stack:
        for name, module in modules.items():
            if not isinstance(module, torch.nn.Module):
                continue
            buffers = _Buffers(module)
            stack.callback(buffers.restore)
            methods = {"forward", *(compiled[name].methods if name in compiled else ())}
            for method in sorted(methods):
                original = getattr(module, method)

                @functools.wraps(original)  # its signature, which pipelines read
                def answer(*args, _original=original, _name=name, _method=method,
                           _buffers=buffers, **kwargs):
                    call = Program(_name, _method, described(args), described(kwargs))
                    calls.append(call)
                    key = _hashable(call.signature())
                    if key is None or key not in answers:
                        guessing = _Yes() if _name not in compiled \
                            else contextlib.nullcontext()
                        with torch.no_grad(), _buffers.on_meta(), guessing:
                            made = _original(*_meta(args), **_meta(kwargs))
                        if key is None:
                            return _zeros(made)
                        answers[key] = made
                    return _zeros(answers[key])

                stack.enter_context(patches.replaced(module, method, answer))
        yield calls


def _hashable(signature: tuple):
    """``signature`` where it can key a dict (None where a static argument cannot)."""
    try:
        hash(signature)
    except TypeError:
        return None
    return signature


class _Yes(torch.overrides.TorchFunctionMode):
    """A boolean meta tensor read as a Python value (``bool(mask.all())``) is True."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.__bool__, torch.Tensor.item) and args \
                and isinstance(args[0], torch.Tensor) and args[0].device.type == "meta" \
                and args[0].dtype == torch.bool and args[0].numel() == 1:
            return True
        return func(*args, **(kwargs or {}))


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


def _meta(value):
    """Host tensors as empty ones on the meta device, in any structure."""
    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_meta(v) for v in value)
    if isinstance(value, dict) and type(value) is dict:
        return {k: _meta(v) for k, v in value.items()}
    return value


def _zeros(value):
    """Meta tensors as zeros on the host, in any structure a module returns (tuples,
    diffusers' and transformers' output classes)."""
    if isinstance(value, torch.Tensor):
        return torch.zeros(value.shape, dtype=value.dtype)
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_zeros(v) for v in value)
    if isinstance(value, dict):
        made = {k: _zeros(v) for k, v in value.items()}
        return made if type(value) is dict else type(value)(**made)
    return value
