"""Attention alone at Wan's shapes: each backend's time, and its error against float32.

    python benchmarks/gpu/attention.py [--json FILE] [--tokens N] [--heads H]
                                       [--window TILE/REACH/GLOBAL ...]

Default shapes: Wan 2.1 1.3B at 480x832, 81 frames: self-attention over 32,760 video
tokens, cross-attention to 512 text tokens, 12 heads of 128, batch 1. For each backend
(``cudnn`` bfloat16, ``cudnn-fp8``; ``--backends`` picks others) and each input kind
(``random``: unit normals, near-uniform attention; ``peaked``: q and k 4x larger,
keys offset, closer to a trained model's sharp rows): the median time of 10 calls,
TFLOP/s (4 x q_len x k_len x heads x dim per call), and the error of the first 512
query rows against float32 attention (relative L2, cosine, largest |diff|); for
``cudnn-fp8`` also against ``fp8-emulated`` (the same arithmetic in XLA): near zero
means the kernel does what Porter's emulation, which CPU tests measure, says.
A backend that fails is reported with its error and the rest go on.

``--window 3x10x13/1x1x1/3`` (repeatable) also times each backend's windowed
self-attention (``attention.window``: tile, reach, global frames) over the video's token
grid (``--grid``, default Wan 1.3B's 480x832 81-frame 21x30x52), with its error against
float32 attention with the window's mask (512 query rows spread over the grid, so
every group of query tiles is checked); the ``vs_dense`` entry is the backend's own
dense time over its windowed time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from porter.transforms.attention import backends, fp8, kernels, window

BACKENDS = {b.name: b for b in backends.BUILTIN}
ROWS = 512  # query rows checked against float32 (a subset: float32 scores are S^2)


def _inputs(kind: str, batch: int, heads: int, q_len: int, k_len: int, dim: int):
    a, b, c = jax.random.split(jax.random.key(0), 3)
    sharp, offset = (4.0, 2.0) if kind == "peaked" else (1.0, 0.0)
    q = jax.random.normal(a, (batch, heads, q_len, dim)) * sharp
    k = jax.random.normal(b, (batch, heads, k_len, dim)) * sharp + offset
    v = jax.random.normal(c, (batch, heads, k_len, dim))
    return [x.astype(jnp.bfloat16) for x in (q, k, v)]


def _errors(out, reference) -> dict:
    out, reference = out.astype(jnp.float32), reference.astype(jnp.float32)
    diff = out - reference
    return {"relative_l2": float(jnp.linalg.norm(diff) / jnp.linalg.norm(reference)),
            "cosine": float(jnp.sum(out * reference)
                            / (jnp.linalg.norm(out) * jnp.linalg.norm(reference))),
            "max_abs": float(jnp.max(jnp.abs(diff)))}


def _timed(call, repeats: int = 10) -> float:
    call().block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call().block_until_ready()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name: str, q, k, v, scale: float, reference) -> dict:
    kernel = BACKENDS[name].kernel
    run = jax.jit(lambda q, k, v: kernel(q, k, v, None, scale=scale))
    try:
        seconds = _timed(lambda: run(q, k, v))
        out = run(q, k, v)[:, :, :ROWS]
    except Exception as error:  # noqa: BLE001 - a backend that cannot run here is a finding
        return {"error": f"{type(error).__name__}: {error}"[:600]}
    b, h, q_len, d = q.shape
    flops = 4 * b * h * q_len * k.shape[2] * d
    result = {"ms": round(seconds * 1e3, 3), "tflop_per_s": round(flops / seconds / 1e12, 1),
              "vs_float32": _errors(out, reference)}
    if name == "cudnn-fp8":
        (qf, sq), (kf, sk), (vf, sv) = (fp8.quantized(x) for x in (q, fp8.smoothed(k), v))
        emulated = fp8.emulated_from(qf[:, :, :ROWS], kf, vf, sq, sk, sv, scale=scale)
        result["vs_emulated"] = _errors(out, emulated)
    return result


def windowed(spec: str, args, scale: float, dense: dict) -> dict:
    """Each backend's windowed self-attention over the grid: time, error against
    float32 attention with the window's mask, speed against its own dense call."""
    tile, reach, first = spec.split("/")
    grid = tuple(int(n) for n in args.grid.split("x"))
    tiling = window.Tiling(grid, tuple(int(n) for n in tile.split("x")),
                           tuple(int(n) for n in reach.split("x")), int(first))
    q, k, v = _inputs("random", 1, args.heads, tiling.tokens, tiling.tokens, args.dim)
    wide = [x.astype(jnp.float32) for x in (q, k, v)]
    # spread over the grid (every group of query tiles, at a real size)
    rows = jnp.arange(min(ROWS, tiling.tokens)) * max(1, tiling.tokens // ROWS)
    keep = jnp.asarray(tiling.keep(rows))[None, None]
    reference = jax.jit(lambda q, k, v: kernels.reference(q, k, v, keep, scale=scale))(
        wide[0][:, :, rows], wide[1], wide[2])
    mesh = jax.sharding.Mesh(jax.devices()[:1], ("dp",))
    found = {"tokens": tiling.tokens, "mask_fraction": round(float(tiling.seen.mean()), 4),
             "groups": len(tiling.groups)}
    for name in args.backends.split(","):
        backend = BACKENDS[name]
        run = jax.jit(lambda q, k, v: window.attend_windowed(
            q, k, v, tiling, scale=scale, mesh=mesh, data_axis="dp", head_axis=None,
            backend=backend))
        try:
            seconds = _timed(lambda: run(q, k, v))
            out = run(q, k, v)[:, :, rows]
        except Exception as error:  # noqa: BLE001 - a finding, as in measure
            found[name] = {"error": f"{type(error).__name__}: {error}"[:600]}
            continue
        own = dense.get(f"self random ({tiling.tokens}x{tiling.tokens})", {}).get(name, {})
        found[name] = {"ms": round(seconds * 1e3, 3), "vs_float32": _errors(out, reference)}
        if "ms" in own:
            found[name]["vs_dense"] = round(own["ms"] / (seconds * 1e3), 2)
        print(f"window {spec}: {name} {json.dumps(found[name])}", file=sys.stderr, flush=True)
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32760, help="video tokens (queries)")
    parser.add_argument("--text", type=int, default=512, help="text tokens (cross keys)")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--backends", default="cudnn,cudnn-fp8")
    parser.add_argument("--json", metavar="FILE", help="also write the results here")
    parser.add_argument("--window", action="append", default=[], metavar="TILE/REACH/GLOBAL",
                        help="also time this window, e.g. 3x10x13/1x1x1/3 (repeatable)")
    parser.add_argument("--grid", default="21x30x52",
                        help="the video's token grid for --window (its tokens replace "
                        "--tokens there)")
    args = parser.parse_args(argv)
    results = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "shapes": {},
               "windows": {}}
    scale = args.dim ** -0.5
    for attention, k_len in (("self", args.tokens), ("cross", args.text)):
        for kind in ("random", "peaked"):
            q, k, v = _inputs(kind, 1, args.heads, args.tokens, k_len, args.dim)
            wide = [x.astype(jnp.float32) for x in (q, k, v)]
            reference = jax.jit(lambda q, k, v: kernels.reference(q, k, v, scale=scale))(
                wide[0][:, :, :ROWS], wide[1], wide[2])
            row = {name: measure(name, q, k, v, scale, reference)
                   for name in args.backends.split(",")}
            results["shapes"][f"{attention} {kind} ({args.tokens}x{k_len})"] = row
            print(f"{attention} {kind} {args.tokens}x{k_len}: {json.dumps(row)}",
                  file=sys.stderr, flush=True)
    for spec in args.window:
        results["windows"][spec] = windowed(spec, args, scale, results["shapes"])
    text = json.dumps(results, indent=2)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
