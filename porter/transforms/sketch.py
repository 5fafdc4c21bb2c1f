"""A component's structure as plain data: its configuration, every tensor's name, shape
and dtype, its linear layers, block lists, submodules and methods. What the passes'
``fit`` and ``detail`` and the plan read of a model, without torch.

A run sketches the modules it loaded (``of``); ``porter validate`` and ``porter plan``
read sketches kept on disk from an earlier build of the same model
(``porter.loading.abstract.sketches``), so a check of a known model imports neither
torch nor diffusers. One mechanism for both: the checks cannot see anything a run's
checks would not.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
from dataclasses import dataclass, field, replace
from typing import Callable

from porter.shims import lazy
from porter.shims.walk import block_lists, named_tensors

torch = lazy.module("torch", __name__)

#: bumped when what a sketch holds changes: older kept sketches are then not read
FORMAT = 3

#: bytes of one value, by torch's dtype name
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex128": 16,
            "complex64": 8, "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1,
            "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1, "float8_e4m3fn": 1,
            "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
            "float8_e8m0fnu": 1}

#: ``torch.is_floating_point``'s dtypes (the ones a recipe's dtypes cast)
FLOATING = frozenset({"float64", "float32", "float16", "bfloat16", "float8_e4m3fn",
                      "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                      "float8_e8m0fnu"})


def dtype_name(dtype) -> str:
    """'bfloat16' for torch.bfloat16 or 'bfloat16'."""
    return str(dtype).removeprefix("torch.")


def itemsize(dtype) -> int:
    """Bytes of one value of ``dtype`` (a torch dtype or its name)."""
    name = dtype_name(dtype)
    return ITEMSIZE[name] if name in ITEMSIZE else getattr(torch, name).itemsize


@dataclass(frozen=True)
class Tensor:
    """A tensor's shape and dtype (torch's name for it)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * itemsize(self.dtype)

    def is_floating_point(self) -> bool:
        return self.dtype in FLOATING


class Config(dict):
    """A configuration as diffusers' and transformers' objects are read: by key, by
    ``.get`` and by attribute (a nested configuration too)."""

    def __init__(self, values=()):
        super().__init__({key: Config(value) if isinstance(value, dict) else value
                          for key, value in dict(values).items()})

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass
class Sketch:
    """One component (see the module's docstring). ``tensors``: each tensor once, by the
    name it first has (``porter.shims.walk.named_tensors``); ``signatures``: each
    callable attribute -> its parameters as (name, kind, has a default), or None where
    Python cannot say."""

    class_name: str
    class_module: str  # where the class is defined (what building it imports)
    config: Config
    tensors: dict[str, Tensor]
    linears: tuple[str, ...]
    submodules: tuple[str, ...]
    blocks: tuple[tuple[str, int], ...]
    signatures: dict[str, list | None]
    #: the constructor's plain defaults (what ``config_values`` judges values against)
    defaults: dict = field(default_factory=dict)
    #: a tied tensor's other names -> the name it is in ``tensors`` under
    aliases: dict[str, str] = field(default_factory=dict)
    #: the torch module, where a check needs more than the sketch holds (a step cache's
    #: hooks, a single-file header's key conversion): the loaded one in a run, built on
    #: the meta device on first use in a check
    module: Callable[[], object] | None = field(default=None, repr=False, compare=False)

    def has_method(self, name: str) -> bool:
        return name in self.signatures

    def signature(self, name: str) -> inspect.Signature | None:
        """The method's signature as bound to an instance (no ``self``); None where
        unknown."""
        params = self.signatures.get(name)
        if params is None:
            return None
        return inspect.Signature([
            inspect.Parameter(p, inspect._ParameterKind(kind),
                              **({"default": None} if default else {}))
            for p, kind, default in params])

    def torch(self):
        """The torch module (see ``module``)."""
        if self.module is None:
            raise RuntimeError(f"no module at hand for this {self.class_name} sketch")
        return self.module()

    def with_tensors(self, tensors: dict[str, Tensor]) -> Sketch:
        return replace(self, tensors=tensors)

    def to_json(self) -> dict:
        return {"class_name": self.class_name, "class_module": self.class_module,
                "config": self.config,
                "tensors": {n: [list(t.shape), t.dtype] for n, t in self.tensors.items()},
                "linears": list(self.linears), "submodules": list(self.submodules),
                "blocks": [list(b) for b in self.blocks], "signatures": self.signatures,
                "defaults": self.defaults, "aliases": self.aliases}

    @classmethod
    def from_json(cls, data: dict, module=None) -> Sketch:
        return cls(data["class_name"], data["class_module"], Config(data["config"]),
                   {n: Tensor(tuple(shape), dtype) for n, (shape, dtype)
                    in data["tensors"].items()},
                   tuple(data["linears"]), tuple(data["submodules"]),
                   tuple((name, count) for name, count in data["blocks"]),
                   data["signatures"], data["defaults"], data["aliases"], module)


def of(module, loader: Callable[[], object] | None = None) -> Sketch:
    """The sketch of a torch module; ``loader`` gives the module back later (default:
    this one)."""
    named = list(module.named_modules())
    first, aliases = {}, {}
    for prefix, sub in named:
        for store in (sub._parameters, sub._buffers):
            for key, tensor in store.items():
                name = f"{prefix}.{key}" if prefix else key
                if tensor is not None and first.setdefault(id(tensor), name) != name:
                    aliases[name] = first[id(tensor)]
    return Sketch(
        class_name=type(module).__name__,
        class_module=type(module).__module__,
        config=_plain_config(getattr(module, "config", None)),
        tensors={name: Tensor(tuple(t.shape), dtype_name(t.dtype))
                 for name, t in named_tensors(module)},
        linears=tuple(path for path, sub in named if isinstance(sub, torch.nn.Linear)),
        submodules=tuple(path for path, _ in named if path),
        blocks=tuple((name, len(blocks)) for name, blocks in block_lists(module)),
        signatures=_signatures(module),
        # as JSON keeps them (an enum's value), so a kept sketch and a fresh one agree
        defaults=json.loads(json.dumps(signature_defaults(_library(module), type(module)))),
        aliases=aliases, module=loader or (lambda: module))


def signature_defaults(library: str, cls: type) -> dict:
    """Argument -> default of what reads the config (a diffusers model's constructor,
    a transformers model's config class), for the defaults ``_fits`` judges by: bools,
    numbers and strings."""
    target = cls.__init__ if library == "diffusers" else cls.config_class.__init__
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError, AttributeError):
        return {}
    return {p.name: p.default for p in parameters
            if isinstance(p.default, (bool, int, float, str))}


def _library(module) -> str:
    """Whose model ``module`` is, as ``config_values`` reads it (no import to tell)."""
    return "transformers" if any(c.__name__ == "PreTrainedModel"
                                 for c in type(module).__mro__) else "diffusers"


def _plain_config(config) -> Config:
    """The configuration as JSON would keep it (tuples as lists, a dtype as its name),
    so that a kept sketch and a fresh one read the same."""
    if config is None:
        return Config()
    values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    for alias, name in (getattr(config, "attribute_map", None) or {}).items():
        if name in values:  # transformers' other names (UMT5's hidden_size: d_model)
            values.setdefault(alias, values[name])
    return Config(json.loads(json.dumps(values, default=str, skipkeys=True)))


def _signatures(module) -> dict[str, list | None]:
    """Every callable attribute of the module as a run reaches it (``getattr``: its
    methods, submodules, functions set on it; ``__call__`` but no other dunder), as
    bound. Properties, cached ones too, are not read (they compute)."""
    found = {}
    for name in dir(module):
        if name.startswith("__") and name != "__call__" \
                or isinstance(inspect.getattr_static(module, name, None),
                              (property, functools.cached_property)):
            continue
        try:
            value = getattr(module, name)
        except Exception:  # noqa: BLE001 - an attribute that cannot be read is no method
            continue
        if not callable(value):
            continue
        try:
            bound = inspect.signature(value)
        except (TypeError, ValueError):
            found[name] = None
            continue
        found[name] = [[p.name, int(p.kind), p.default is not inspect.Parameter.empty]
                       for p in bound.parameters.values()]
    return found
