"""A port while its passes run (``Building``: what the passes share, each pass's record
in the field named after it), and the record a built port leaves for its calls
(``Ported``).

The records are plain data, defined here and not beside their passes, so that every
pass can name ``Building`` and this module names no pass: the import arrows point one
way. A record a pass above this layer keeps (the step cache's ``Caching``) is held as
an object and named in a comment.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, NamedTuple

from porter.runtime.notices import quiet

if TYPE_CHECKING:
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe
    from porter.registry import Registry
    from porter.runtime import Runtime
    from porter.shims.patch import Patch
    from porter.transforms.jit.autosplit import Split
    from porter.transforms.jit.traces import TraceCache


class Loaded(NamedTuple):
    """What the load pass records (``porter.loading``)."""

    pipe: object
    modules: dict  # the pipeline's torch components, by name
    weights: dict  # component -> ComponentWeights, for components built empty
    checkpoint: dict  # what names the checkpoint (checkpoints.identity), for the record


@dataclass
class Quantized:
    """What the quantize pass records."""

    format: str | None = None  # the format run (``auto`` resolved), None: off
    layers: dict = field(default_factory=dict)  # component -> linear layers quantized
    #: component -> {weight name: Pending}: quantized by placement as read
    pending: dict = field(default_factory=dict)

    def described(self) -> dict | None:
        """What the run record says of it (None: nothing quantized)."""
        return {"format": self.format, "layers": self.layers} if self.format else None


@dataclass
class Placement:
    """What the placement pass records, per component."""

    reports: dict = field(default_factory=dict)  # name -> ``report``: the run record's
    assignments: dict = field(default_factory=dict)  # name -> [sharding.Assignment]
    unsharded: set = field(default_factory=set)  # no weight rule and no activation rule
    activations: dict = field(default_factory=dict)  # name -> the activation rules applied


@dataclass
class Jitted:
    """What the compile pass records."""

    rules: dict = field(default_factory=dict)  # component -> CompileRule (compiled ones)
    one_device: set = field(default_factory=set)  # compiled whole, run on one device
    scanned: dict = field(default_factory=dict)  # component -> block lists as one scan
    traces: TraceCache | None = None  # None: the compile cache is off
    splits: dict[str, Split] = field(default_factory=dict)  # component -> its split


@dataclass
class Building:
    """What the passes share. The driver sets the first fields; a pass that records
    something writes the field named after it and reads those of the passes before it."""

    recipe: Recipe
    registry: Registry
    family: ModelFamily
    runtime: Runtime  # the mesh (a target's deviceless one, for ``porter compile``)
    say: Callable[[str], None] = quiet  # status lines, for a run with progress shown
    #: contexts held until the port is built (the patches, while the model loads)
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    timings: dict = field(default_factory=dict)  # seconds the driver measured
    # written by the passes, in their order
    patches: list[tuple[Patch, dict]] = field(default_factory=list)  # applied, in order
    load: Loaded | None = None  # the pipeline, its torch components, their weights
    lora: list[dict] = field(default_factory=list)  # the adapters fused (record entries)
    quantize: Quantized = field(default_factory=Quantized)
    placement: Placement = field(default_factory=Placement)
    compile: Jitted = field(default_factory=Jitted)
    cache: object = None  # porter.stepcache.session.Caching, with a ``cache:`` section
    #: the text encoders' kept outputs (``porter.transforms.encodings.Kept``), if kept
    encodings: object = None

    @property
    def pipe(self):
        return self.load.pipe

    @property
    def modules(self) -> dict:
        return self.load.modules

    def ported(self) -> Ported:
        checkpoint = dict(self.load.checkpoint)
        if self.lora:
            checkpoint["lora"] = self.lora
        if self.quantize.described():  # the weights as run: what a stage was made with
            checkpoint["quantize"] = self.quantize.described()
        return Ported(self.compile.traces, self.placement.reports, self.compile.splits,
                      self.cache, self.patches, checkpoint, self.encodings)


@dataclass
class Ported:
    """A built port's records: what its calls read."""

    traces: TraceCache | None = None  # the trace cache used (None: compile cache off)
    #: component -> where its weights came from and what each device holds
    weights: dict = field(default_factory=dict)
    #: component -> what could not be compiled whole
    splits: dict[str, Split] = field(default_factory=dict)
    caching: object = None  # porter.stepcache.session.Caching, with a ``cache:`` section
    #: applied around calls (empty where the caller holds the patches itself)
    patches: list[tuple[Patch, dict]] = field(default_factory=list)
    checkpoint: dict = field(default_factory=dict)  # what names the weights, LoRA too
    encodings: object = None  # the text encoders' kept outputs (encodings.Kept), if kept
