"""The attention pass: torchax's lowering of scaled_dot_product_attention, swapped for
a registered backend (``backends``, ``kernels``), sharded over the mesh (``sharded``),
block-sparse over a video's tiles where the recipe windows it (``window``).

Around each call of the port (the pass's call-time part), ``installed`` puts the
recipe's backend in torchax's op table; around a transformer's calls after a window's
dense steps, the video's token grid is set (``trace_context``). Inside
``disabled()`` (around components the recipe skips), below a minimum sequence length
and for additive float masks (biases, not key masks) calls go back to torchax's own
lowering. Boolean masks are exact in every backend.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from porter.runtime import mesh_text, trace_context
from porter.shims import lazy, op_table
from porter.shims.compat import import_torchax
from porter.transforms import CALL, STEP, Calling, Checking, Pass, sharding
from porter.transforms.attention import backends, sharded, window
from porter.transforms.attention.backends import BUILTIN, AttentionBackend
from porter.transforms.attention.window import checks as window_checks

torch = lazy.module("torch", __name__)

if TYPE_CHECKING:
    from porter.errors import Problem
    from porter.recipe import Recipe
    from porter.recipe.schema import WindowSpec
    from porter.registry import Registry
    from porter.runtime import Runtime
    from porter.transforms.building import Building

__all__ = ["AttentionBackend", "AttentionSettings", "BUILTIN", "PASS", "attend", "counted",
           "disabled", "installed", "repeated", "skipped"]


def sdpa_ops() -> tuple:
    """PyTorch's attention, as a function and as an ATen op: what a backend replaces."""
    return (torch.nn.functional.scaled_dot_product_attention,
            torch.ops.aten.scaled_dot_product_attention)


@dataclass(frozen=True)
class AttentionSettings:
    """What every attention call of a port runs with: the recipe's ``attention`` section,
    the registered backends, and the mesh and platform its programs are compiled for."""

    backends: dict  # name -> AttentionBackend: the registry's
    mesh: object  # jax.sharding.Mesh
    platform: str  # where the programs run (a TPU target, from any host)
    backend: str | None = None  # the section's: a name, "auto", or None (torchax's own)
    cross_backend: str | None = None  # for keys of another length than the queries'
    block_q: int = 1024
    block_kv: int = 1024
    data_axis: str | None = None  # the batch's mesh axis
    head_axis: str | None = None  # the heads' (or, where they do not divide it, queries')
    window: WindowSpec | None = None  # ``attention.window``
    min_seq_len: int = 0  # shorter query sequences run torchax's own lowering
    #: the axes the transformer's tokens are split over outside attention (``ring``,
    #: ``sp``: ``sharding.token_axes``)
    token_axes: tuple[str, ...] = ()

    @classmethod
    def of(cls, recipe: Recipe, registry: Registry, runtime: Runtime) -> AttentionSettings:
        section = recipe.attention
        return cls(registry.attention, runtime.mesh, runtime.platform, section.backend,
                   section.cross_backend, section.block_q, section.block_kv,
                   section.data_axis, sharding.head_axis(section, runtime.axes),
                   section.window, section.min_seq_len,
                   sharding.token_axes(runtime.axes))


def disabled():
    """Inside, attention uses torchax's own lowering (for skipped components)."""
    return trace_context.ATTENTION_OFF.set(True)


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


def counted():
    """Inside, each attention call traced adds its FLOPs per device (the scores and the
    weighted sum: 4 x batch x heads x queries x keys x head_dim, divided among the
    devices the kernel is sharded over) to the ``Tally`` this yields: the work a kernel
    that the compiler sees as an opaque call (Pallas, cuDNN) does out of its sight."""
    return trace_context.ATTENTION_TALLY.set(Tally())


def repeated(times: int):
    """Inside, attention traced once runs ``times`` times (a loop body: a scan)."""
    return trace_context.ATTENTION_REPEATS.set(trace_context.ATTENTION_REPEATS.get() * times)


def _count(flops: float, backend=None) -> None:
    """Add a call's FLOPs to the tally being kept, if one is (0 repeats: traced for
    shapes only, it never runs)."""
    tally, repeats = trace_context.ATTENTION_TALLY.get(), trace_context.ATTENTION_REPEATS.get()
    if tally is not None and repeats:
        tally.add(flops * repeats, backend)


def _keep_mask(attn_mask, is_causal: bool, q_len: int, k_len: int):
    import jax.numpy as jnp
    keep = attn_mask
    if is_causal:
        causal = jnp.tril(jnp.ones((q_len, k_len), dtype=bool), k_len - q_len)
        keep = causal if keep is None else jnp.logical_and(keep, causal)
    return keep


def attend(q, k, v, attn_mask=None, is_causal=False, scale=None, *, backend: str,
           settings: AttentionSettings):
    """Attention on JAX arrays (B, H, S, D) with ``backend`` (a name or "auto"),
    sharded and windowed as ``settings`` say."""
    import jax.numpy as jnp

    if k.shape[1] != q.shape[1]:  # grouped-query attention: repeat key/value heads
        k = jnp.repeat(k, q.shape[1] // k.shape[1], axis=1)
        v = jnp.repeat(v, q.shape[1] // v.shape[1], axis=1)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    tiling = window.for_call(settings.window, q.shape[2], k.shape[2]) \
        if attn_mask is None and not is_causal else None
    chosen = backends.choose(backend, settings.platform, q.shape[2], k.shape[2],
                             settings.backends, batch_heads=q.shape[0] * q.shape[1])
    if tiling is not None:  # the video's self-attention, windowed
        return _windowed(q, k, v, tiling, chosen, scale, settings)
    keep = _keep_mask(attn_mask, is_causal, q.shape[2], k.shape[2])
    options = dict(scale=scale, block_q=settings.block_q, block_kv=settings.block_kv)
    if backends.takes_platform(chosen.kernel):  # compiled for this platform, wherever
        options["platform"] = settings.platform  # the host is (a TPU target from a CPU)
    axes = dict(data_axis=settings.data_axis, head_axis=settings.head_axis,
                token_axes=settings.token_axes)
    # a ring without the backend's kernel is Porter's XLA loop, which XLA counts
    circle = sharded.ring_split(settings.mesh, q, k, keep, **axes)
    if chosen.share is not None or not circle:
        shares = circle or sharded.split(settings.mesh, q.shape, settings.data_axis,
                                         settings.head_axis, settings.token_axes)
        # its int8 Q.K^T only where Mosaic runs it (elsewhere, or with a mask, XLA runs
        # it and counts it)
        native = keep is None and settings.platform == "tpu"
        _count(4 * math.prod(q.shape) * k.shape[2] / shares, chosen if native else None)
    return sharded.run(chosen.kernel, settings.mesh, q, k, v, keep, **axes,
                       share=chosen.share, mosaic=_mosaic(chosen, settings), **options)


def _mosaic(backend, settings: AttentionSettings) -> bool:
    """Does ``backend``'s kernel compile by Mosaic here (a TPU), where XLA cannot split
    it (elsewhere a Pallas kernel is interpreted: XLA ops, which it splits)?"""
    return backend.mosaic and settings.platform == "tpu"


def _windowed(q, k, v, tiling, chosen, scale, settings: AttentionSettings):
    """A windowed call (``window.attend_windowed`` picks the kernel for the backend);
    what a kernel the compiler cannot see computes is counted here, the int8 backend's
    own kernel's Q.K^T as int8 where Mosaic runs it (a TPU)."""
    def count(flops, kernel):
        _count(flops, chosen if kernel == "gathered" and settings.platform == "tpu"
               else None)

    return window.attend_windowed(
        q, k, v, tiling, scale=scale, mesh=settings.mesh, data_axis=settings.data_axis,
        head_axis=settings.head_axis, backend=chosen, platform=settings.platform,
        block_q=settings.block_q, block_kv=settings.block_kv, counted=count,
        token_axes=settings.token_axes, mosaic=_mosaic(chosen, settings))


@contextlib.contextmanager
def installed(env, settings: AttentionSettings):
    """``settings``' backend in place of torchax's scaled_dot_product_attention in
    ``env``, for the block."""
    interop = import_torchax().interop
    fallback = env._ops.get(torch.nn.functional.scaled_dot_product_attention)

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False):
        # Additive float masks (e.g. T5's position bias) are biases, not key masks:
        # torchax's lowering computes them exactly.
        float_mask = attn_mask is not None and attn_mask.dtype != torch.bool
        if trace_context.ATTENTION_OFF.get() or float_mask \
                or query.shape[-2] < settings.min_seq_len:
            return fallback.func(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                 enable_gqa, env=env)
        q, k, v, mask = interop.jax_view((query, key, value, attn_mask))
        name = backends.for_call(settings, q.shape[2], k.shape[2])
        out = attend(q, k, v, mask, is_causal, scale, backend=name, settings=settings)
        return interop.torch_view(out)

    with op_table.overridden(env, {op: sdpa for op in sdpa_ops()}):
        yield


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


def platform_problems(recipe: Recipe, registry: Registry, platform: str,
                      device=None) -> list[Problem]:
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
    return found + _unpartitioned(recipe, registry, platform)


def _unpartitioned(recipe: Recipe, registry: Registry, platform: str) -> list[Problem]:
    """A Mosaic kernel (splash on a TPU) on a sharded mesh with no axis said for the
    batch or the heads: XLA cannot partition the kernel by itself, so each chip would
    run every call whole (``sharded.run``; a bare kernel stopped the compile at "Mosaic
    kernels cannot be automatically partitioned"). Round a ``ring`` a call whose
    queries divide it (the transformer's tokens: validate checks them) runs the kernel
    on each device's share. A call that nothing splits beside axes that are said
    (another component's attention through the recipe's backend: a text encoder's
    few heads and tokens) runs whole on each chip, as XLA runs what it cannot split."""
    section = recipe.attention
    if platform != "tpu" or section.data_axis is not None \
            or sharding.head_axis(section, recipe.mesh) is not None \
            or sharding.RING_AXIS in sharding.token_axes(recipe.mesh):
        return []  # elsewhere a Pallas kernel is interpreted: XLA partitions it
    if not any(isinstance(size, int) and size > 1 for size in recipe.mesh.values()):
        return []  # one device, or sizes the devices decide ("auto"): not known here
    found = []
    for key in ("backend", "cross_backend"):
        name = getattr(section, key)
        if name is None:
            continue
        for backend in backends.possible(name, platform, registry.attention):
            if not backend.mosaic:
                continue
            axes = mesh_text(recipe.mesh)
            found.append(recipe.problem(
                f"attention.{key}", f"{name!r} runs {backend.name}, a Mosaic kernel, on a "
                f"{platform.upper()} mesh {axes} without attention.head_axis or "
                "attention.data_axis: XLA cannot partition it by itself, so each chip "
                "would run every attention call whole",
                hint="say the axis that holds the heads (attention.head_axis: tp) and the "
                "one that splits the batch (attention.data_axis: dp)"))
    return found


def skipped(b: Building) -> list[str]:
    """The components that run with torchax's own attention, not the recipe's backend
    (none without one: nothing is wrapped): those ``attention.skip`` names, and, when
    the backend shards attention over the mesh (``data_axis``, ``head_axis``, the
    tokens' ``sp`` or ``ring``), those
    compiled to run on one device: their inputs are on one device, not the mesh (a
    CLIP image encoder); unsharded, the kernel runs there."""
    section = b.recipe.attention
    if section.backend is None:
        return []
    split = section.data_axis is not None \
        or sharding.head_axis(section, b.runtime.axes) is not None \
        or bool(sharding.token_axes(b.runtime.axes))
    return [name for name in b.modules
            if name in section.skip or (split and name in b.compile.one_device)]


# ------------------------------------------------------------------------- the pass

def _check(c: Checking) -> list[Problem]:
    """Backends registered, axes in the mesh, the window (no devices needed)."""
    recipe, section, found = c.recipe, c.recipe.attention, []
    known = sorted(c.registry.attention)
    for key in ("backend", "cross_backend"):
        name = getattr(section, key)
        if name is not None and name != "auto" and name not in c.registry.attention:
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
    return found + window_checks.problems(recipe, c.family)


def _apply(b: Building) -> None:
    """Wrap each skipped component (the compiled one: its programs are traced inside the
    wrapper)."""
    for name in skipped(b):
        setattr(b.pipe, name, Skipped(getattr(b.pipe, name)))


def _detail(c: Checking) -> str | None:
    section = c.recipe.attention
    if section.backend is None:
        return None
    cross = f" (cross-attention: {section.cross_backend})" if section.cross_backend else ""
    windowed = ", windowed" if section.window is not None else ""
    return section.backend + cross + windowed + (f", skipped in {', '.join(section.skip)}"
                                                 if section.skip else "")


def _around(c: Calling):
    """The backend around a call; around a transformer's calls where the recipe windows
    attention, the video's grid (this call's size), but for the window's dense steps."""
    section = c.recipe.attention
    if section.backend is None:
        return None
    if c.scope == CALL:
        return installed(c.runtime.env, AttentionSettings.of(c.recipe, c.registry,
                                                             c.runtime))
    window_ = section.window
    if c.scope != STEP or window_ is None or \
            (c.step is not None and c.step < window_.dense_steps):
        return None
    grid = c.family.token_grid(c.recipe)
    return trace_context.VIDEO_GRID.set(None if grid is None else tuple(map(int, grid)))


PASS = Pass(
    "attention", ("attention",), "wrap the components attention.skip names (and those run "
    "on one device when attention is sharded) to keep torchax's own attention",
    each_call="the recipe's backend in torchax's op table; with attention.window, the "
    "video's token grid around a transformer's calls after the dense steps",
    check=_check, apply=_apply, detail=_detail, around=_around)
