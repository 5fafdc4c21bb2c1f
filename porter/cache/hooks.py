"""Diffusers' cache hooks on a transformer compiled in pieces.

Each block of a cached transformer is its own compiled program
(``porter.transforms.compile.pieces``); the transformer's forward runs on the
host and calls them. Diffusers' hooks (``apply_mag_cache``,
``apply_first_block_cache``, ``apply_taylorseer_cache``) wrap those calls, so
their decisions (a float compared to a threshold; one device scalar per call
for the first-block cache) are Python between programs, and a skipped block is
a program not run. A ``Tally`` on the transformer counts, per call, the blocks
that ran; a ``Calibration`` records MagCache's magnitude ratios.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from porter.cache import block_lists


def _diffusers_hooks():
    from diffusers.hooks.hooks import (BaseState, CacheContext, HookRegistry, ModelHook,
                                       StateManager, _set_cache_context)
    return BaseState, CacheContext, HookRegistry, ModelHook, StateManager, _set_cache_context


class Tally:
    """Per transformer call: its cache context (cond, uncond, ...) and how many
    blocks ran. Calls without a context get 'inference', as diffusers' MagCache
    gives them (the first-block cache would otherwise refuse them)."""

    def __init__(self, module):
        _, CacheContext, HookRegistry, ModelHook, StateManager, set_context = _diffusers_hooks()
        tally = self
        self.calls: list[list] = []  # [context, blocks computed]
        self.current: list | None = None
        self.listeners: list = []  # f(event, context, ...) for a Calibration

        class Root(ModelHook):
            _is_stateful = True  # so that cache_context(name) reaches our state manager

            def __init__(self):
                super().__init__()
                self.state_manager = StateManager(dict)

            def pre_forward(self, module, *args, **kwargs):
                self.set_here = self.state_manager._context is None
                if self.set_here:
                    set_context(module, CacheContext("inference"))
                tally.current = [self.state_manager._context.name, 0]
                return args, kwargs

            def post_forward(self, module, output):
                tally.calls.append(tally.current)
                tally.current = None
                if self.set_here:
                    set_context(module, None)
                return output

            def reset_state(self, module):  # the pipeline's reset keeps the log
                return module

        HookRegistry.check_if_exists_or_initialize(module).register_hook(Root(), "porter_tally")
        blocks = [block for blocks in block_lists(module) for block in blocks]
        self.blocks_per_call = len(blocks)
        for index, block in enumerate(blocks):
            block.forward = self._counted(block.forward, index)

    def _counted(self, forward, index: int):
        @functools.wraps(forward)
        def call(*args, **kwargs):
            output = forward(*args, **kwargs)
            if self.current is not None:
                self.current[1] += 1
                for listener in self.listeners:
                    listener(index, self.current[0], args, kwargs, output)
            return output
        return call


def install(module, chosen, blocks_per_call: int | None = None) -> Tally:
    """Diffusers' hooks for ``chosen`` (a methods model) on ``module``; returns the
    Tally. MagCache's ratios and step count are set per run (``retarget``)."""
    tally = Tally(module)
    method = chosen.method
    if method == "magcache" and chosen.calibrate:
        pass  # nothing skipped: a Calibration listens to the tally
    elif method == "magcache":
        from diffusers.hooks import MagCacheConfig, apply_mag_cache
        config = MagCacheConfig(threshold=chosen.threshold, max_skip_steps=chosen.max_skip_steps,
                                retention_ratio=chosen.retention_ratio, mag_ratios=[1.0],
                                num_inference_steps=1)
        apply_mag_cache(module, config)
        tally.config = config
    elif method == "first_block":
        if tally.blocks_per_call < 2:
            raise Misfit("method", f"the first-block cache needs two blocks or more; this "
                         f"transformer has {tally.blocks_per_call}",
                         hint="another method: magcache or taylorseer")
        from diffusers.hooks import FirstBlockCacheConfig, apply_first_block_cache
        apply_first_block_cache(module, FirstBlockCacheConfig(threshold=chosen.threshold))
    elif method == "taylorseer":
        from diffusers.hooks import TaylorSeerCacheConfig, apply_taylorseer_cache
        from porter.transforms.dtypes import DTYPES
        values = chosen.model_dump(exclude={"method"})
        values["taylor_factors_dtype"] = DTYPES[chosen.taylor_factors_dtype]
        if values["cache_identifiers"] is None and not chosen.use_lite_mode:
            values["cache_identifiers"] = block_patterns(module)
        config = TaylorSeerCacheConfig(**values)
        _hooked_whole(module, config)
        apply_taylorseer_cache(module, config)
    else:
        raise ValueError(f"no hooks for cache method {method!r}")
    module._porter_cache = tally
    return tally


class Misfit(ValueError):
    """The method cannot work on this transformer as configured; ``key`` is the
    ``cache`` key to change."""

    def __init__(self, key: str, message: str, hint: str):
        super().__init__(message)
        self.key, self.hint = key, hint


def _hooked_whole(module, config) -> None:
    """TaylorSeer's identifiers may name only what is compiled as one piece: a child
    of the transformer or a block of a block list."""
    import re

    from diffusers.hooks.taylorseer_cache import _resolve_patterns

    inactive, active = _resolve_patterns(config)
    if config.use_lite_mode:
        return  # proj_out and whole blocks
    patterns = inactive + (active or [])
    pieces = {name for name, _ in module.named_children()}
    pieces |= {f"{name}.{index}" for name, child in module.named_children()
               if isinstance(child, torch.nn.ModuleList) for index in range(len(child))}
    inside = [name for name, _ in module.named_modules()
              if name and name not in pieces and any(re.fullmatch(p, name) for p in patterns)]
    if inside:  # there its Python would run once, at tracing, and never again
        raise Misfit("cache_identifiers", f"{len(inside)} module(s) inside a compiled "
                     f"block, e.g. {inside[0]!r}: a step cache can hook whole blocks or "
                     "the transformer's children only",
                     hint=r"e.g. cache_identifiers: ['blocks\.\d+'] (the default), or "
                          "leave it out; `porter inspect` lists module names")


def block_patterns(module) -> list[str]:
    """Regexes of every block of the module's block lists: TaylorSeer's default on a
    transformer compiled in pieces (diffusers' own default names attention modules,
    which live inside a block's program)."""
    from porter.cache import BLOCK_LISTS
    return [rf"{name}\.\d+" for name in BLOCK_LISTS
            if isinstance(getattr(module, name, None), torch.nn.ModuleList)]


def retarget(tally: Tally, ratios, steps: int, done: int = 0) -> None:
    """Point MagCache at this run: ``ratios`` resampled (nearest neighbour, as
    diffusers does) to ``steps``, the calls per context this transformer gets in a
    whole run, of which a resumed run has ``done`` already."""
    from diffusers.hooks import MagCacheConfig
    from diffusers.hooks.mag_cache import nearest_interp

    left = steps - done
    curve = nearest_interp(torch.tensor(ratios), steps)[done:] if left > 0 else [1.0]
    fresh = MagCacheConfig(threshold=tally.config.threshold,
                           max_skip_steps=tally.config.max_skip_steps,
                           retention_ratio=tally.config.retention_ratio,
                           mag_ratios=list(curve), num_inference_steps=max(left, 1))
    for item in dataclasses.fields(fresh):
        setattr(tally.config, item.name, getattr(fresh, item.name))


def reset(module) -> None:
    """Forget every hook's state (a new video starts cold) and the tally."""
    registry = getattr(module, "_diffusers_hook", None)
    if registry is not None:
        registry.reset_stateful_hooks(recurse=True)
    module._porter_cache.calls.clear()


class Calibration:
    """MagCache's magnitude ratios, per context, as diffusers' calibration computes
    them: mean over tokens of |residual_t| / |residual_t-1|, the residual being the
    last block's output minus the first block's input (1.0 at the first call)."""

    def __init__(self, tally: Tally):
        self.tally = tally
        self.last = tally.blocks_per_call - 1
        self.head: dict = {}
        self.previous: dict = {}
        self.ratios: dict[str, list[float]] = {}
        tally.listeners.append(self._seen)

    def _seen(self, index, context, args, kwargs, output):
        if index == 0:
            self.head[context] = kwargs.get("hidden_states", args[0] if args else None)
        if index != self.last:
            return
        out = output[0] if isinstance(output, tuple) else output
        head = self.head[context]
        residual = (out - head if out.shape == head.shape
                    else out[:, -head.shape[1]:] - head)
        previous = self.previous.get(context)
        if previous is None:
            ratio = 1.0
        else:
            now = torch.linalg.norm(residual.float(), dim=-1)
            before = torch.linalg.norm(previous.float(), dim=-1)
            ratio = (now / (before + 1e-8)).mean().item()
        self.ratios.setdefault(context, []).append(ratio)
        self.previous[context] = residual
