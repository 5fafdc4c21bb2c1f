"""One generation's own state: what it runs, where it saves, what it reports; and
what it produced.

``Port.run`` takes a ``Call``; the runner and the stages read its settings and fill
its timings, history and stage files, so no function down the line needs more than
the port, the call and what it works on. It returns an ``Outcome``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from porter.rundir.artifacts import STAGES
from porter.runtime import notices


@dataclass
class Resumed:
    """What a run continues from: the stage before its first (record and tensors) and
    the denoising checkpoint, both read and checked before any weight is loaded."""

    previous: dict | None = None  # {"meta": record, "tensors": {...}}
    progress: object = None  # porter.rundir.progress.Progress


@dataclass
class Call:
    recipe: object  # the port's recipe, or one with other generate settings
    wanted: tuple[str, ...] = STAGES  # the stages to run (a staged family's)
    directory: Path | None = None  # where each stage and checkpoint is saved; None: kept
    resumed: Resumed | None = None  # what the run continues from
    progress: bool = False  # a progress bar on stderr while denoising
    on_step: Callable | None = None  # on_step(done, total) after each denoising step
    #: live previews every N steps (``porter.generate.preview``); None: the recipe's
    #: ``output.preview_every``
    preview_every: int | None = None
    say: Callable = notices.quiet  # status lines
    #: on_frames(chunk) for each chunk of frames as the decode makes them (uint8
    #: (count, height, width, 3), in order; ``porter.generate.streaming``)
    on_frames: Callable | None = None
    started: float = field(default_factory=time.perf_counter)  # when the call began
    # filled as the call runs
    timings: dict = field(default_factory=dict)
    history: list = field(default_factory=list)  # where each stage ran
    #: warnings about this call's own settings: recorded with each call that has them
    #: (``notices.warn`` prints a message once a process)
    warnings: list = field(default_factory=list)
    stage_files: dict = field(default_factory=dict)  # stage file -> SHA-256, in directory
    guidance_cache: object = None  # this run's (porter.stepcache.guidance), if any
    schedule: dict | None = None  # the scheduler and timesteps it ran (scheduler.describe)
    audio: object = None  # the sound the pipeline made (porter.rundir.audio.Audio), if any

    def __post_init__(self):
        if self.directory is not None:  # a str from Python (the docs write a path)
            self.directory = Path(self.directory).expanduser()
        previous = self.resumed.previous if self.resumed else None
        if previous and not self.history:  # the stages before this run's first
            self.history = list(previous["meta"].get("history") or [])

    @property
    def first_step(self) -> int:
        """The denoising step this call starts after (0, or a checkpoint's)."""
        progress = self.resumed.progress if self.resumed else None
        return progress.step if progress else 0


@dataclass
class Outcome:
    """What one generation produced, before anything is written."""
    latents: object  # CPU torch tensor, or None (encode only; a pipeline that hides them)
    frames: object  # uint8 array (count, height, width, 3), or None (before decode)
    timings: dict
    history: list = field(default_factory=list)
    warnings: list = field(default_factory=list)  # given while loading and in this call
    stage_files: dict = field(default_factory=dict)  # stage file -> SHA-256 (a directory's)
    schedule: dict | None = None  # the scheduler and timesteps the steps ran on
    audio: object = None  # the sound made with the frames (porter.rundir.audio.Audio)
