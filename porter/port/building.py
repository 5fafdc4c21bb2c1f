"""A port while its passes run, and the record a built port leaves for its calls."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from porter.loading import Loaded
from porter.runtime.notices import quiet
from porter.transforms.jit import Jitted
from porter.transforms.placement import Placement
from porter.transforms.quantize import Quantized

if TYPE_CHECKING:
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe
    from porter.registry import Registry
    from porter.runtime import Runtime
    from porter.stepcache.session import Caching
    from porter.transforms.jit.autosplit import Split
    from porter.transforms.jit.traces import TraceCache
    from porter.transforms.patches import Patch


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
    cache: Caching | None = None  # with a ``cache:`` section
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
    caching: Caching | None = None  # with a ``cache:`` section
    #: applied around calls (empty where the caller holds the patches itself)
    patches: list[tuple[Patch, dict]] = field(default_factory=list)
    checkpoint: dict = field(default_factory=dict)  # what names the weights, LoRA too
    encodings: object = None  # the text encoders' kept outputs (encodings.Kept), if kept
