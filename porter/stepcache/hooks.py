"""Diffusers' cache hooks on a transformer compiled in pieces.

Each block of a cached transformer is its own compiled program
(``porter.transforms.jit.pieces``); the transformer's forward runs on the
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

from porter.shims import lazy
from porter.shims.walk import block_lists
from porter.transforms.dtypes import DTYPES

torch = lazy.module("torch", __name__)


def _diffusers_hooks():
    from diffusers.hooks.hooks import (
        CacheContext,
        HookRegistry,
        ModelHook,
        StateManager,
        _set_cache_context,
    )
    return CacheContext, HookRegistry, ModelHook, StateManager, _set_cache_context


class Tally:
    """Per transformer call: its cache context (cond, uncond, ...) and how many
    blocks ran. Calls without a context get 'inference', as diffusers' MagCache
    gives them (the first-block cache would otherwise refuse them)."""

    def __init__(self, module):
        CacheContext, HookRegistry, ModelHook, StateManager, set_context = _diffusers_hooks()
        tally = self
        self.calls: list[list] = []  # [context, blocks computed]
        self.current: list | None = None
        self.listeners: list = []  # f(index, context, args, kwargs, output): Calibration

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

            def reset_state(self, module):  # forget a call cut short; the log stays
                self.state_manager.reset()
                tally.current = None
                return module

        HookRegistry.check_if_exists_or_initialize(module).register_hook(Root(), "porter_tally")
        self.blocks = [block for _, blocks in block_lists(module) for block in blocks]
        self.blocks_per_call = len(self.blocks)
        for index, block in enumerate(self.blocks):
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


class Misfit(ValueError):
    """The method cannot work on this transformer as configured; ``key`` is the
    ``cache`` key to change."""

    def __init__(self, key: str, message: str, hint: str):
        super().__init__(message)
        self.key, self.hint = key, hint


def check(module, chosen) -> None:
    """``Misfit`` where ``chosen`` cannot work on ``module`` (found before placing
    weights: only the module's structure is read)."""
    blocks = [block for _, blocks in block_lists(module) for block in blocks]
    if chosen.method in ("magcache", "first_block"):
        _blocks_known(blocks)
    if chosen.method == "first_block" and len(blocks) < 2:
        raise Misfit("method", f"the first-block cache needs two blocks or more; this "
                     f"transformer has {len(blocks)}",
                     hint="another method: magcache or taylorseer")
    if chosen.method == "taylorseer":
        _hooked_whole(module, taylorseer_config(module, chosen))


def install(module, chosen) -> Tally:
    """Diffusers' hooks for ``chosen`` (a methods model, ``check``ed) on ``module``;
    returns the Tally. MagCache's ratios and step count are set per run
    (``retarget``)."""
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
        tally.config, tally.retention_ratio = config, chosen.retention_ratio
    elif method == "first_block":
        from diffusers.hooks import FirstBlockCacheConfig, apply_first_block_cache
        apply_first_block_cache(module, FirstBlockCacheConfig(threshold=chosen.threshold))
    elif method == "taylorseer":
        from diffusers.hooks import apply_taylorseer_cache
        apply_taylorseer_cache(module, taylorseer_config(module, chosen))
    else:
        raise ValueError(f"no hooks for cache method {method!r}")
    module._porter_cache = tally
    return tally


def taylorseer_config(module, chosen):
    """diffusers' TaylorSeerCacheConfig for ``chosen``; no identifiers (or an empty
    list, which diffusers reads as its own default): every block of the block lists
    (diffusers' default names attention modules, which live inside a block's
    compiled program)."""
    from diffusers.hooks import TaylorSeerCacheConfig

    values = chosen.model_dump(exclude={"method"})
    values["taylor_factors_dtype"] = DTYPES[chosen.taylor_factors_dtype]
    if not values["cache_identifiers"] and not chosen.use_lite_mode:
        values["cache_identifiers"] = [rf"{name}\.\d+" for name, _ in block_lists(module)]
    return TaylorSeerCacheConfig(**values)


def _hooked_whole(module, config) -> None:
    """TaylorSeer's identifiers may name only what is compiled as one piece: a child
    of the transformer or a block of a block list."""
    import re

    from diffusers.hooks.taylorseer_cache import _resolve_patterns

    if config.use_lite_mode:
        return  # proj_out and whole blocks
    inactive, active = _resolve_patterns(config)
    patterns = inactive + active
    pieces = {name for name, _ in module.named_children()}
    pieces |= {f"{name}.{index}" for name, blocks in block_lists(module)
               for index in range(len(blocks))}
    inside = [name for name, _ in module.named_modules()
              if name and name not in pieces and any(re.fullmatch(p, name) for p in patterns)]
    if inside:  # there its Python would run once, at tracing, and never again
        raise Misfit("cache_identifiers", f"{len(inside)} module(s) inside a compiled "
                     f"block, e.g. {inside[0]!r}: a step cache can hook whole blocks or "
                     "the transformer's children only",
                     hint=r"e.g. cache_identifiers: ['blocks\.\d+'] (the default), or "
                          "leave it out; `porter inspect` lists module names")


def _blocks_known(blocks) -> None:
    """MagCache and the first-block cache read a block's arguments and outputs from
    diffusers' registry of block classes."""
    for block in blocks:
        try:
            block_metadata(block)
        except ValueError:
            raise Misfit("method", f"diffusers' cache hooks do not know the block class "
                         f"{type(block).__name__} (where hidden states go in and out)",
                         hint="taylorseer needs no such knowledge; or register the class "
                              "with diffusers' TransformerBlockRegistry in a plugin") from None


def block_metadata(block):
    """Where ``block`` takes and returns its hidden states (diffusers' registry)."""
    from diffusers.hooks._helpers import TransformerBlockRegistry
    return TransformerBlockRegistry.get(type(block))


def retarget(tally: Tally, ratios, steps: int, done: int = 0) -> None:
    """Point MagCache at this run: ``ratios`` resampled (nearest neighbour, as
    diffusers does) to ``steps``, the calls per context this transformer gets in a
    whole run, of which a resumed run has ``done`` already."""
    from diffusers.hooks import MagCacheConfig
    from diffusers.hooks.mag_cache import nearest_interp

    left = steps - done
    curve = nearest_interp(torch.tensor(ratios), steps)[done:] if left > 0 else [1.0]
    retention = tally.retention_ratio
    if done and left > 0:  # the steps always computed are counted over the whole run
        retention = max(0, int(retention * steps + 0.5) - done) / left
    fresh = MagCacheConfig(threshold=tally.config.threshold,
                           max_skip_steps=tally.config.max_skip_steps,
                           retention_ratio=retention,
                           mag_ratios=list(curve), num_inference_steps=max(left, 1))
    for item in dataclasses.fields(fresh):
        setattr(tally.config, item.name, getattr(fresh, item.name))


def reset(module) -> None:
    """Forget every hook's state (a new video starts cold) and the tally's log."""
    registry = getattr(module, "_diffusers_hook", None)
    if registry is not None:
        registry.reset_stateful_hooks(recurse=True)
    module._porter_cache.calls.clear()


class Calibration:
    """MagCache's magnitude ratios, per context, as diffusers' calibration computes
    them: mean over tokens of |residual_t| / |residual_t-1|, the residual being the
    last block's output minus the first block's input (1.0 at the first call)."""

    def __init__(self, tally: Tally):
        self.last = tally.blocks_per_call - 1
        self.first_block = block_metadata(tally.blocks[0])
        self.last_block = block_metadata(tally.blocks[-1])
        self.head: dict = {}
        self.previous: dict = {}
        self.ratios: dict[str, list[float]] = {}
        tally.listeners.append(self._seen)

    def _seen(self, index, context, args, kwargs, output):
        if index == 0:
            self.head[context] = self.first_block._get_parameter_from_args_kwargs(
                self.first_block.hidden_states_argument_name, args, kwargs)
        if index != self.last:
            return
        out = output[self.last_block.return_hidden_states_index] \
            if isinstance(output, tuple) else output
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
