"""One flex-attention call both of Porter's ways: every score at once, and block by block.

    python benchmarks/flex_blocks.py                       # 8,192 tokens, 4 heads
    python benchmarks/flex_blocks.py --tokens 16384 --heads 2 --json results/flex.json

The call is Wan-Animate-2's shape in small: bfloat16 queries, keys and values of width
64, and a block mask in which every query sees the first half of the keys and, in the
second half, its own frame's part (8 frames): the generation tokens and the reference
frame of Wan-Animate-2's steps. Each way is compiled for this machine, run once to warm
it, then timed over ``--repeat`` calls; XLA's own count of its temporaries is reported
beside the time, and the two outputs' largest difference.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np
    from torch.nn.attention import flex_attention as flex

    from porter.registry import builtin
    from porter.shims.compat import import_torchax
    from porter.transforms.attention import flex as route

    torchax = import_torchax()
    tokens, half, frame = args.tokens, args.tokens // 2, args.tokens // 8

    def reference(b, h, q, k):
        return (k < half) | ((k - half) // (frame // 2) == q // frame)

    def attend(q, k, v):
        mask = flex.create_block_mask(reference, None, None, tokens, tokens, device="jax")
        return flex.flex_attention(q, k, v, block_mask=mask)

    x = jnp.asarray(np.random.default_rng(0).standard_normal((1, args.heads, tokens, 64)),
                    jnp.bfloat16)
    rows, outputs = [], {}
    for way, limit in (("every score at once", 1 << 50), ("block by block", 0)):
        route.DENSE_SCORES_BYTES = limit
        with torchax.default_env(), builtin.BLOCK_MASK.applied(), \
                builtin.FLEX_ATTENTION.applied():
            compiled = jax.jit(torchax.interop.jax_view(attend)).lower(x, x, x).compile()
        compiled(x, x, x).block_until_ready()
        start = time.perf_counter()
        for _ in range(args.repeat):
            out = compiled(x, x, x)
        out.block_until_ready()
        seconds = (time.perf_counter() - start) / args.repeat
        outputs[way] = np.asarray(out, np.float32)
        rows.append({"way": way, "tokens": tokens, "heads": args.heads, "seconds": seconds,
                     "temporary_bytes": compiled.memory_analysis().temp_size_in_bytes})
        print(f"{way}: {seconds:.3f} s a call, "
              f"{rows[-1]['temporary_bytes'] / 2**20:.0f} MiB of temporaries")
    difference = float(np.abs(outputs["block by block"]
                              - outputs["every score at once"]).max())
    print(f"largest difference between the two: {difference:.4f}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "difference": difference}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
