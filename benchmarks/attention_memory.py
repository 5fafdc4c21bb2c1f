"""One attention layer at a real sequence length: time and measured peak memory.

    python benchmarks/attention_memory.py --backend blockwise        # Wan 1.3B, 480x832x81
    python benchmarks/attention_memory.py --backend reference        # compiles, reports, skips
    python benchmarks/attention_memory.py --backend torch-cpu --json

Defaults are one self-attention layer of Wan 1.3B at 480x832, 81 frames:
32,760 tokens, 12 heads of 128, float32. For each backend it reports the
working memory XLA plans for the compiled kernel (``memory_analysis``) and,
when that fits in this machine's memory, runs the layer and measures the
process's peak resident memory (the OS's high-water mark) and the time.
Each backend runs in its own process, so one peak does not hide another.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

GIB = 2 ** 30


def rss_peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def machine_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="blockwise",
                        help="reference | blockwise | torch-cpu (default blockwise)")
    parser.add_argument("--tokens", type=int, default=32760)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--block", type=int, default=1024, help="block_q = block_kv")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp

    from porter.transforms.attention import BUILTIN

    kernel = {b.name: b.kernel for b in BUILTIN}[args.backend]
    shape = (1, args.heads, args.tokens, args.dim)
    scale = args.dim ** -0.5

    def layer(q, k, v):
        return kernel(q, k, v, None, scale=scale, block_q=args.block, block_kv=args.block)

    spec = jax.ShapeDtypeStruct(shape, jnp.float32)
    compiled = jax.jit(layer).lower(spec, spec, spec).compile()
    planned = compiled.memory_analysis().temp_size_in_bytes
    scores = args.heads * args.tokens ** 2 * 4
    result = {"backend": args.backend, "tokens": args.tokens, "heads": args.heads,
              "head_dim": args.dim, "float32_scores_bytes": scores,
              "xla_planned_working_bytes": planned, "machine_memory_bytes": machine_memory()}
    inputs_bytes = 3 * 4 * args.heads * args.tokens * args.dim
    if planned + inputs_bytes > 0.8 * machine_memory():
        result["ran"] = False
        result["why_not"] = (f"needs {planned / GIB:.1f} GiB of working memory, this machine "
                             f"has {machine_memory() / GIB:.1f} GiB")
    else:
        keys = jax.random.split(jax.random.key(0), 3)
        q, k, v = (jax.random.normal(key, shape, jnp.float32) for key in keys)
        jax.block_until_ready((q, k, v))
        before = rss_now()
        start = time.perf_counter()
        compiled(q, k, v).block_until_ready()
        result.update(ran=True, seconds=round(time.perf_counter() - start, 2),
                      rss_before_bytes=before, rss_peak_bytes=rss_peak(),
                      rss_peak_over_inputs_bytes=rss_peak() - before)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.backend}: {args.tokens} tokens x {args.heads} heads of {args.dim}; "
              f"float32 scores would be {scores / GIB:.1f} GiB; XLA plans "
              f"{planned / GIB:.2f} GiB of working memory")
        if result["ran"]:
            print(f"  ran in {result['seconds']} s; process peak RSS "
                  f"{result['rss_peak_bytes'] / GIB:.2f} GiB "
                  f"({result['rss_peak_over_inputs_bytes'] / GIB:.2f} GiB above the inputs)")
        else:
            print(f"  not run: {result['why_not']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
