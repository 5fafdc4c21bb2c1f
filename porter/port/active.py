"""What a port's calls run inside: its patches, Porter's lowerings and the recipe's
attention backend in torchax's op table, failures in model code explained, the
scheduler's tables on the mesh. A run, ``porter verify``, ``porter bench`` and
``porter compile`` enter the same context around the same programs."""

from __future__ import annotations

import contextlib

from porter.generate import schedulers
from porter.shims import lowerings, tracing
from porter.transforms import attention, patches
from porter.transforms.attention import window


@contextlib.contextmanager
def ops_installed(recipe, registry, runtime):
    """Porter's lowerings (``porter.shims.lowerings``) and the recipe's attention
    backend in place of torchax's, for the block."""
    with lowerings.installed(runtime.env):
        if recipe.attention.backend is None:
            yield
            return
        undo = attention.install(runtime.env, recipe.attention, registry.attention,
                                 runtime.mesh, runtime.platform)
        try:
            yield
        finally:
            undo()


def transformer_video(recipe, registry):
    """The context a transformer runs in: where the recipe windows attention, its
    video's token grid (``attention.window.video``). Only around transformer calls: a
    VAE's or text encoder's attention may have as many tokens, and is not windowed."""
    grid = registry.family(recipe.model.family).token_grid(recipe) \
        if recipe.attention.window else None
    return window.video(grid)


@contextlib.contextmanager
def transformer_ops(recipe, registry, runtime):
    """``ops_installed`` and ``transformer_video``: what `verify` and `bench` call the
    transformer in, as a run's denoising steps do."""
    with ops_installed(recipe, registry, runtime), transformer_video(recipe, registry):
        yield


@contextlib.contextmanager
def active(recipe, registry, runtime, applied: list, scheduler=None):
    """Everything ``ops_installed`` does, with the patches ``applied`` (as the patches
    pass chose them), model failures explained (``tracing``) and ``scheduler``'s tables
    moved onto the mesh as its methods run (``schedulers``)."""
    with patches.applied(applied), tracing.explained(), \
            ops_installed(recipe, registry, runtime), \
            schedulers.on_device(scheduler, runtime):
        yield
