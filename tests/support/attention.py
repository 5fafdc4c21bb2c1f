"""What the attention tests share: bfloat16 inputs of two kinds, and Wan 14B's 720p
attention compiled for a TPU through Porter's ``attend``."""

import jax
import jax.numpy as jnp

#: Wan 14B at 720p, 81 frames: both guidance passes, 40 heads of 128, 75,600 tokens
WAN14B_720P = (2, 40, 75600, 128)


def inputs(kind, q_len=512, k_len=512, heads=2, dim=64):
    """q, k, v in bfloat16: unit normals ("random"), or sharp rows with keys offset
    ("peaked": what low-precision attention finds hardest)."""
    a, b, c = jax.random.split(jax.random.key(1), 3)
    sharp, offset = (4.0, 2.0) if kind == "peaked" else (1.0, 0.0)
    q = jax.random.normal(a, (1, heads, q_len, dim)) * sharp
    k = jax.random.normal(b, (1, heads, k_len, dim)) * sharp + offset
    v = jax.random.normal(c, (1, heads, k_len, dim))
    return [x.astype(jnp.bfloat16) for x in (q, k, v)]


def compiled_wan14b_720p(target: str, backend: str = "auto", window=None):
    """Wan 14B's 720p attention, batch on dp and heads on tp, compiled for ``target``
    by Porter's ``attend`` (``window``: an ``attention.window`` section, over its token
    grid): (the compiled program, the FLOPs tally traced)."""
    return compiled_attention(target, WAN14B_720P, (21, 45, 80), backend, window)


def compiled_attention(target: str, shape, grid, backend: str = "auto", window=None):
    """Self-attention of ``shape`` (batch, heads, tokens, dim) over the video ``grid``,
    batch on dp and heads on tp (2 x 4), compiled for ``target`` by Porter's ``attend``:
    (the compiled program, the FLOPs tally traced)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from porter.aot import targets
    from porter.runtime import trace_context
    from porter.transforms import attention

    mesh = targets.mesh(targets.named(target), {"dp": 2, "tp": 4})
    spec = jax.ShapeDtypeStruct(shape, jnp.bfloat16,
                                sharding=NamedSharding(mesh, P("dp", "tp")))
    settings = attention.AttentionSettings(
        {b.name: b for b in attention.BUILTIN}, mesh, "tpu", backend, data_axis="dp",
        head_axis="tp", window=window)
    with attention.counted() as flops, \
            trace_context.VIDEO_GRID.set(grid if window is not None else None):
        compiled = jax.jit(lambda q, k, v: attention.attend(
            q, k, v, backend=backend, settings=settings)).lower(spec, spec, spec).compile()
    return compiled, flops
