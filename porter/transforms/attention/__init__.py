"""The attention pass: torchax's lowering of scaled_dot_product_attention, swapped for
a registered backend (``backends``, ``kernels``), sharded over the mesh (``sharded``).

``install`` overrides the op in the torchax environment; ``disabled()`` (used
around components the recipe skips), a minimum sequence length and additive
float masks (biases, not key masks) route calls back to torchax's own
lowering. Boolean masks are exact in every backend. ``install`` returns an
undo function.
"""

from __future__ import annotations

import contextlib
import contextvars
import math

import torch

from porter.shims.compat import import_torchax
from porter.transforms import Pass
from porter.transforms.attention import backends, sharded, window
from porter.transforms.attention.backends import BUILTIN, AttentionBackend

__all__ = ["AttentionBackend", "BUILTIN", "PASS", "install", "disabled", "attend", "skipped"]

_disabled = contextvars.ContextVar("porter_attention_disabled", default=False)
_tally = contextvars.ContextVar("porter_attention_flops", default=None)
_repeats = contextvars.ContextVar("porter_attention_repeats", default=1)

SDPA_OPS = (torch.nn.functional.scaled_dot_product_attention,
            torch.ops.aten.scaled_dot_product_attention)


@contextlib.contextmanager
def disabled():
    """Inside, attention uses torchax's own lowering (for skipped components)."""
    token = _disabled.set(True)
    try:
        yield
    finally:
        _disabled.reset(token)


class Tally(list):
    """Attention's FLOPs per device, one entry a call traced; ``matmuls``: those of
    them a kernel runs as matmuls of a narrower kind (operand kind -> FLOPs: int8
    attention's Q.K^T), which a chip may run at another peak."""

    def __init__(self):
        super().__init__()
        self.matmuls: dict[str, float] = {}

    def add(self, flops: float, backend=None) -> None:
        self.append(flops)
        kind = getattr(backend, "score_kind", None)
        if kind is not None:  # the scores' half: Q.K^T
            self.matmuls[kind] = self.matmuls.get(kind, 0.0) + flops / 2


@contextlib.contextmanager
def counted():
    """Inside, each attention call traced adds its FLOPs per device (the scores and the
    weighted sum: 4 x batch x heads x queries x keys x head_dim, divided among the
    devices the kernel is sharded over) to the ``Tally`` this yields: the work a kernel
    that the compiler sees as an opaque call (Pallas, cuDNN) does out of its sight."""
    found = Tally()
    token = _tally.set(found)
    try:
        yield found
    finally:
        _tally.reset(token)


@contextlib.contextmanager
def repeated(times: int):
    """Inside, attention traced once runs ``times`` times (a loop body: a scan)."""
    token = _repeats.set(_repeats.get() * times)
    try:
        yield
    finally:
        _repeats.reset(token)


def _keep_mask(attn_mask, is_causal: bool, q_len: int, k_len: int):
    import jax.numpy as jnp
    keep = attn_mask
    if is_causal:
        causal = jnp.tril(jnp.ones((q_len, k_len), dtype=bool), k_len - q_len)
        keep = causal if keep is None else jnp.logical_and(keep, causal)
    return keep


def attend(q, k, v, attn_mask=None, is_causal=False, scale=None, *, backend, mesh,
           config, platform: str):
    """Attention on JAX arrays (B, H, S, D) with the configured backend and sharding."""
    import jax.numpy as jnp

    if k.shape[1] != q.shape[1]:  # grouped-query attention: repeat key/value heads
        k = jnp.repeat(k, q.shape[1] // k.shape[1], axis=1)
        v = jnp.repeat(v, q.shape[1] // v.shape[1], axis=1)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    tiling = window.tiling(config.get("window"), q.shape[2], k.shape[2]) \
        if attn_mask is None and not is_causal else None
    chosen = backends.choose(backend, platform, q.shape[2], k.shape[2], config["registry"],
                             batch_heads=q.shape[0] * q.shape[1])
    if tiling is not None:  # the video's self-attention, windowed
        return _windowed(q, k, v, tiling, chosen, scale, mesh, config, platform)
    keep = _keep_mask(attn_mask, is_causal, q.shape[2], k.shape[2])
    options = dict(scale=scale, block_q=config["block_q"], block_kv=config["block_kv"])
    if backends.takes_platform(chosen.kernel):  # compiled for this platform, wherever
        options["platform"] = platform  # the host is (a TPU target from a CPU host)
    if _tally.get() is not None and _repeats.get():  # 0: traced for shapes only
        shares = sharded.split(mesh, q.shape, config["data_axis"], config["head_axis"])
        # its int8 Q.K^T only where Mosaic runs it (elsewhere, or with a mask, XLA
        # runs it and counts it)
        native = keep is None and platform == "tpu"
        _tally.get().add(4 * math.prod(q.shape) * k.shape[2] * _repeats.get() / shares,
                         chosen if native else None)
    return sharded.run(chosen.kernel, mesh, q, k, v, keep, data_axis=config["data_axis"],
                       head_axis=config["head_axis"], **options)


def _windowed(q, k, v, tiling, chosen, scale, mesh, config, platform: str):
    """A windowed call (``window.attend`` picks the kernel for the backend); what a
    kernel the compiler cannot see computes is counted here, the int8 backend's own
    kernel's Q.K^T as int8 where Mosaic runs it (a TPU)."""
    def count(flops, kernel):
        if _tally.get() is not None and _repeats.get():
            native = kernel == "gathered" and platform == "tpu"
            _tally.get().add(flops * _repeats.get(), chosen if native else None)

    return window.attend(q, k, v, tiling, scale=scale, mesh=mesh,
                         data_axis=config["data_axis"], head_axis=config["head_axis"],
                         backend=chosen, platform=platform, block_q=config["block_q"],
                         block_kv=config["block_kv"], counted=count)


def install(env, recipe_attention, registry: dict, mesh, platform: str):
    """Override scaled_dot_product_attention in ``env``; returns an undo function."""
    interop = import_torchax().interop

    saved = {op: env._ops.get(op) for op in SDPA_OPS}
    fallback = saved[torch.nn.functional.scaled_dot_product_attention]
    config = dict(registry=registry, block_q=recipe_attention.block_q,
                  block_kv=recipe_attention.block_kv, data_axis=recipe_attention.data_axis,
                  head_axis=recipe_attention.head_axis, window=recipe_attention.window)

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False):
        # Additive float masks (e.g. T5's position bias) are biases, not key masks:
        # torchax's lowering computes them exactly.
        float_mask = attn_mask is not None and attn_mask.dtype != torch.bool
        if _disabled.get() or float_mask or query.shape[-2] < recipe_attention.min_seq_len:
            return fallback.func(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                 enable_gqa, env=env)
        q, k, v, mask = interop.jax_view((query, key, value, attn_mask))
        backend = backends.for_call(recipe_attention, q.shape[2], k.shape[2])
        out = attend(q, k, v, mask, is_causal, scale, backend=backend, mesh=mesh,
                     config=config, platform=platform)
        return interop.torch_view(out)

    for op in SDPA_OPS:
        env.override_op_definition(op, sdpa)

    def undo():
        for op, previous in saved.items():
            if previous is None:
                env._ops.pop(op, None)
            else:
                env._ops[op] = previous
    return undo


class Skipped:
    """A component whose calls (and method calls) run with the replacement disabled."""

    def __init__(self, target):
        self._target = target

    def __call__(self, *args, **kwargs):
        with disabled():
            return self._target(*args, **kwargs)

    def __getattr__(self, name):
        value = getattr(self._target, name)
        if callable(value) and not isinstance(value, (torch.nn.Module, type)):
            def call(*args, **kwargs):
                with disabled():
                    return value(*args, **kwargs)
            return call
        return value


def problems(recipe, registry, family=None) -> list:
    """Backend registered, axes in the mesh (no devices needed)."""
    section, found = recipe.attention, []
    known = sorted(registry.attention)
    for key in ("backend", "cross_backend"):
        name = getattr(section, key)
        if name is not None and name != "auto" and name not in registry.attention:
            import difflib  # lazy: only for a misspelt name
            close = difflib.get_close_matches(name, known, n=1)
            found.append(recipe.problem(f"attention.{key}", f"unknown backend {name!r}",
                                        hint=f"did you mean {close[0]!r}?" if close else
                                        f"registered: auto, {', '.join(known)}"))
    if section.cross_backend is not None and section.backend is None:
        found.append(recipe.problem(
            "attention.cross_backend", "set without attention.backend: with no backend, "
            "torchax's own lowering runs every attention call",
            hint="set attention.backend too (e.g. auto)"))
    for key in ("data_axis", "head_axis"):
        axis = getattr(section, key)
        if axis is not None and axis not in recipe.mesh:
            found.append(recipe.problem(f"attention.{key}", f"mesh has no axis {axis!r}",
                                        hint=f"mesh axes: {', '.join(recipe.mesh)}"))
    return found + window_problems(recipe, family)


def window_problems(recipe, family) -> list:
    """``attention.window`` against the backend, the family and the video's token grid:
    tiles that fit it, a window that skips something, dense steps fewer than all."""
    spec = recipe.attention.window
    if spec is None:
        return []
    where = "attention.window"
    if recipe.attention.backend is None:
        return [recipe.problem(where, "set without attention.backend: with no backend, "
                               "torchax's own lowering runs every attention call",
                               hint="set attention.backend too (e.g. auto)")]
    if family is not None and not family.windows:
        return [recipe.problem(where, f"family {family.name!r} does not window its "
                               "attention (its text and video tokens attend together, or "
                               "its pipeline runs its own loop)",
                               hint="windows run on Wan models; leave it out here")]
    found = []
    if spec.global_frames % spec.tile[0]:
        found.append(recipe.problem(f"{where}.global_frames", f"{spec.global_frames} is not "
                                    f"a multiple of the tile's {spec.tile[0]} frames",
                                    hint="global keys are whole tiles"))
    steps = recipe.generate.steps
    if steps is not None and spec.dense_steps >= steps:
        found.append(recipe.problem(f"{where}.dense_steps", f"{spec.dense_steps} dense "
                                    f"steps of {steps}: no step is windowed",
                                    hint=f"fewer than {steps}, or leave attention.window "
                                    "out"))
    grid = family.token_grid(recipe) if family is not None else None
    if grid is None or found:
        return found
    axes = ("frames", "height", "width")
    for axis, size, tile in zip(axes, grid, spec.tile):
        if tile > size:
            found.append(recipe.problem(f"{where}.tile", f"{tile} {axis} per tile, but the "
                                        f"video has {size} token {axis} "
                                        f"({'x'.join(map(str, grid))} tokens)",
                                        hint=f"at most {size}"))
    tiling = window.Tiling(grid, tuple(spec.tile), tuple(spec.reach), spec.global_frames)
    count = math.prod(tiling.tiles)
    if not found and count > window.MAX_TILES:
        found.append(recipe.problem(f"{where}.tile", f"{count} tiles of "
                                    f"{'x'.join(map(str, spec.tile))} tokens: at most "
                                    f"{window.MAX_TILES}", hint="larger tiles (a tile is "
                                    "a kernel block: 128 tokens or more suit every chip)"))
    text = family.text_length(recipe) if hasattr(family, "text_length") else None
    if not found and math.prod(grid) == text:
        found.append(recipe.problem(
            where, f"the video's {math.prod(grid)} tokens are as many as the text's: "
            "cross-attention to the text would be windowed as if it were the video's",
            hint="another size or generate.max_sequence_length"))
    if not found:
        if tiling.seen.all():
            found.append(recipe.problem(
                where, f"every tile sees every other ({'x'.join(map(str, tiling.tiles))} "
                f"tiles of {'x'.join(map(str, spec.tile))} tokens, reach "
                f"{'x'.join(map(str, spec.reach))}): attention stays dense, with padding",
                hint="smaller tiles or reach, or leave attention.window out"))
    return found


def platform_problems(recipe, registry, platform: str, device=None) -> list:
    """The recipe's backends that cannot run on ``platform``, or on ``device`` (one of
    the devices JAX started with, where it has: a GPU of an older generation)."""
    found = []
    for key in ("backend", "cross_backend"):
        name = getattr(recipe.attention, key)
        backend = registry.attention.get(name) if name not in (None, "auto") else None
        if backend is None:
            continue
        if platform not in backend.platforms:
            found.append(recipe.problem(
                f"attention.{key}", f"backend {name!r} does not run on {platform} (runs "
                f"on {', '.join(backend.platforms)})",
                hint="use 'auto' to pick one for the platform"))
        elif device is not None and backend.requires is not None \
                and (reason := backend.requires(device)):
            found.append(recipe.problem(f"attention.{key}", f"backend {name!r}: {reason}",
                                        hint="use 'auto' to pick one for this device"))
    return found


# ------------------------------------------------------------------------- the pass

def skipped(b) -> list[str]:
    """The components that run with torchax's own attention, not the recipe's backend
    (none without one: nothing is wrapped): those ``attention.skip`` names, and, when
    the backend shards attention over the mesh (``data_axis``, ``head_axis``), those
    compiled to run on one device: their inputs are on one device, not the mesh (a
    CLIP image encoder); unsharded, the kernel runs there."""
    section = b.recipe.attention
    if section.backend is None:
        return []
    sharded_ = section.data_axis is not None or section.head_axis is not None
    return [name for name in b.modules
            if name in section.skip or (sharded_ and name in b.compile.one_device)]


def _skip(b) -> None:
    """Wrap each skipped component (the compiled one: its programs are traced inside the
    wrapper)."""
    for name in skipped(b):
        setattr(b.pipe, name, Skipped(getattr(b.pipe, name)))


def _detail(recipe, registry, family, modules) -> str | None:
    section = recipe.attention
    if section.backend is None:
        return None
    cross = f" (cross-attention: {section.cross_backend})" if section.cross_backend else ""
    return section.backend + cross + (f", skipped in {', '.join(section.skip)}"
                                      if section.skip else "")


PASS = Pass(
    "attention", ("attention",), "attention through the recipe's backend while programs "
    "are traced (installed around each call)",
    check=problems,
    apply=_skip, detail=_detail)
