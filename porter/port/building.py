"""A port while its passes run, and the record a built port leaves for its runs."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

from porter.loading import Loaded
from porter.runtime.notices import quiet
from porter.transforms.compile import Compiled
from porter.transforms.placement import Placement
from porter.transforms.quantize import Quantized


@dataclass
class Building:
    """What the passes share. The driver sets the first fields; a pass that records
    something writes the field named after it and reads those of the passes before it."""

    recipe: object
    registry: object
    family: object
    runtime: object  # porter.runtime.Runtime: the mesh (a target's deviceless one)
    say: Callable = quiet  # status lines, for a run with progress shown
    #: contexts held until the port is built (the patches, while the model loads)
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    timings: dict = field(default_factory=dict)  # seconds the driver measured
    # written by the passes, in their order
    patches: list = field(default_factory=list)  # [(Patch, params)] applied
    load: Loaded | None = None  # the pipeline, its torch components, their weights
    lora: list = field(default_factory=list)  # the adapters fused (their record entries)
    quantize: Quantized = field(default_factory=Quantized)
    placement: Placement = field(default_factory=Placement)
    compile: Compiled = field(default_factory=Compiled)
    cache: object = None  # porter.stepcache.session.Caching, with a ``cache:`` section

    @property
    def pipe(self):
        return self.load.pipe

    @property
    def modules(self) -> dict:
        return self.load.modules

    def ported(self) -> "Ported":
        checkpoint = dict(self.load.checkpoint)
        if self.lora:
            checkpoint["lora"] = self.lora
        if self.quantize.record():  # the weights as run: what a stage was made with
            checkpoint["quantize"] = self.quantize.record()
        return Ported(self.compile.traces, self.placement.reports, self.compile.splits,
                      self.cache, self.patches, checkpoint)


@dataclass
class Ported:
    """A built port's records: what its runs read."""

    traces: object  # the TraceCache used (None when the compile cache is off)
    weights: dict  # component -> where its weights came from and what each device holds
    splits: dict  # component -> autosplit.Split: what could not be compiled whole
    caching: object = None  # porter.stepcache.session.Caching, with a ``cache:`` section
    patches: list = field(default_factory=list)  # [(Patch, params)] applied around calls
    checkpoint: dict = field(default_factory=dict)  # what names the weights, LoRA too
