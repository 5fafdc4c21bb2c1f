"""One self-attention layer over a video's tokens: dense (blockwise) against the
block-sparse window (``attention.window``), time and error, on this machine.

    python benchmarks/window_attention.py                      # Wan 1.3B 480x832x81, 2 heads
    python benchmarks/window_attention.py --reach 1 1 1 --json
    python benchmarks/window_attention.py --backend torch-cpu   # gathered keys, that kernel

Defaults: Wan 1.3B's token grid at 480x832, 81 frames (21 x 30 x 52 = 32,760
tokens), 2 of its 12 heads of 128 (the time scales with heads), float32, tiles of
3 x 6 x 13 tokens (7 x 5 x 4 tiles), reach 2 x 1 x 1 tiles, the first 3 frames
global. Each kernel is compiled first, then timed over ``--repeats`` calls; the
error is the window's against dense attention with the window's token mask
(``Tiling.keep``), which it equals up to the order of float sums. ``--backend``
runs the window through that backend's own dense kernel on gathered keys (as
``attention.backend`` does in a run), and dense through the same kernel; without it,
Porter's loop against dense ``blockwise``.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", type=int, nargs=3, default=[21, 30, 52])
    parser.add_argument("--tile", type=int, nargs=3, default=[3, 6, 13])
    parser.add_argument("--reach", type=int, nargs=3, default=[2, 1, 1])
    parser.add_argument("--global-frames", type=int, default=3)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--block", type=int, default=1024, help="dense: block_q = block_kv")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--backend", help="an attention backend (reference, torch-cpu, "
                        "...): its kernel on gathered keys, and dense")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    from porter.transforms.attention import BUILTIN, kernels, window

    tiling = window.Tiling(tuple(args.grid), tuple(args.tile), tuple(args.reach),
                           args.global_frames)
    shape = (1, args.heads, tiling.tokens, args.dim)
    q, k, v = (jax.random.normal(key, shape) for key in jax.random.split(jax.random.key(0), 3))
    scale = args.dim ** -0.5
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("dp",))
    backend = {b.name: b for b in BUILTIN}[args.backend] if args.backend else None
    dense = backend.kernel if backend is not None else kernels.blockwise
    runs = {
        "dense": jax.jit(lambda q, k, v: dense(
            q, k, v, None, scale=scale, block_q=args.block, block_kv=args.block)),
        "window": jax.jit(lambda q, k, v: window.attend_windowed(
            q, k, v, tiling, scale=scale, mesh=mesh, data_axis="dp", head_axis=None,
            backend=backend, block_q=args.block, block_kv=args.block)),
    }
    found = {"grid": args.grid, "tile": args.tile, "reach": args.reach,
             "global_frames": args.global_frames, "tokens": tiling.tokens,
             "heads": args.heads, "tiles": list(tiling.tiles),
             "backend": args.backend, "kernel": window.kernel_for(tiling, backend,
                                                                  (None, None, None)),
             "computed_fraction": round(tiling.computed_fraction, 4),
             "mask_fraction": round(float(tiling.seen.mean()), 4),
             "device": jax.devices()[0].device_kind}
    outputs = {}
    for name, run in runs.items():
        start = time.perf_counter()
        outputs[name] = run(q, k, v).block_until_ready()
        compiled = time.perf_counter() - start
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            run(q, k, v).block_until_ready()
            times.append(time.perf_counter() - start)
        found[name] = {"seconds": round(min(times), 3), "first_call_s": round(compiled, 2)}
    found["speedup"] = round(found["dense"]["seconds"] / found["window"]["seconds"], 2)
    # against dense attention with the window's mask, every tenth query (memory)
    rows = np.arange(0, tiling.tokens, 10)
    keep = jnp.asarray(tiling.keep(rows))
    masked = kernels.reference(q[:, :, rows], k, v, keep, scale=scale)
    found["max_abs_error_vs_masked_dense"] = float(jnp.abs(outputs["window"][:, :, rows]
                                                           - masked).max())
    if args.json:
        print(json.dumps(found))
    else:
        for key, value in found.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
