"""One causal 3-D convolution of Wan's VAE decoder (3 x 3 x 3, its two cached frames
already in front), compiled for a TPU slice in several forms, with the TPU compiler's
own cycle estimate of each instruction summed by kind: seconds a form, where the whole
decode's program takes minutes (benchmarks/README.md, "Where a latent frame's decode
goes"). The sizes default to the full-size decoder's last stage at 480x832: 96
channels, 4 output frames.

    python benchmarks/conv_forms.py [--target v6e-8] [--channels 96] [--frames 4]
        [--height 480] [--width 832] [--dtype float32] [--forms F ...] [--json]
        [--save FILE]

Forms (the chips' count is the target's):

- ``split-width``: (batch, channels, frames, height, width), the width split over the
  chips by XLA, as Porter's recipes split the decode;
- ``split-height``: the same, the height split;
- ``channels-last``: (batch, frames, height, width, channels), the width split;
- ``one-chip``: one chip's share of ``split-width`` with its halo (width / chips + 2)
  on one chip: no split, no exchange;
- ``row-blocks``: that share handed over as ``chips`` row blocks with their halo
  rows, batched (what the compiler makes of a batch of one otherwise);
- ``kept-in-blocks``: those row blocks without their halo rows, which the convolution
  takes from the neighbouring blocks itself (the cost a decoder that kept its
  activations in row blocks would pay at each convolution);
- ``blocks-split-width``: the whole image as ``--blocks`` row blocks (Porter's 8 by
  default), each taking its halo rows from its neighbours, the width split over the
  chips by XLA (the form of Porter's decode on a TPU, ``porter.families.row_blocks``).

Results (``--save``, one record a run appended): benchmarks/results/conv-forms-v6e.json.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import sys
import time
from pathlib import Path

from results_io import save

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from porter.aot import hlo, targets  # noqa: E402 - the checkout's own Porter
from porter.families import row_blocks  # noqa: E402 - as above
from porter.commands.compile import host_compiles  # noqa: E402 - as above

FORMS = ("split-width", "split-height", "channels-last", "one-chip", "row-blocks",
         "kept-in-blocks", "blocks-split-width")
FIRST = ("NCDHW", "OIDHW", "NCDHW")
LAST = ("NDHWC", "DHWIO", "NDHWC")


def conv(x, w, numbers, padding):
    from jax import lax

    return lax.conv_general_dilated(x, w, (1, 1, 1), padding, dimension_numbers=numbers)


def form(name: str, target, channels: int, frames: int, height: int, width: int,
         blocks: int | None = None):
    """(the function, its input's and weight's shapes, the input's split, the mesh)."""
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    chips, t = target.chips, frames + 2  # the two cached frames in front
    blocks = blocks or row_blocks.BLOCKS
    mesh = targets.mesh(target, {"x": chips})
    same = ((0, 0), (1, 1), (1, 1))  # the frames already padded, height and width not
    first, last = (channels, channels, 3, 3, 3), (3, 3, 3, channels, channels)
    if name == "split-width":
        return (lambda x, w: conv(x, w, FIRST, same), (1, channels, t, height, width),
                first, P(None, None, None, None, "x"), mesh)
    if name == "split-height":
        return (lambda x, w: conv(x, w, FIRST, same), (1, channels, t, height, width),
                first, P(None, None, None, "x", None), mesh)
    if name == "channels-last":
        return (lambda x, w: conv(x, w, LAST, same), (1, t, height, width, channels),
                last, P(None, None, None, "x", None), mesh)
    if name == "blocks-split-width":
        return (lambda x, w: _with_halo_rows(x, w, 1), (blocks, channels, t, height // blocks,
                                                          width), first,
                P(None, None, None, None, "x"), mesh)
    one = Mesh(targets.devices(target)[:1], ("x",))
    share = width // chips + 2
    if name == "one-chip":
        return (lambda x, w: conv(x, w, FIRST, ((0, 0), (1, 1), (0, 0))),
                (1, channels, t, height, share), first, P(), one)
    if name == "row-blocks":
        return (lambda x, w: conv(x, w, FIRST, "VALID"),
                (chips, channels, t, height // chips + 2, share), first, P(), one)
    if name == "kept-in-blocks":
        return (_with_halo_rows, (chips, channels, t, height // chips, share), first, P(),
                one)
    raise ValueError(f"no form {name!r}; forms: {', '.join(FORMS)}")


def _with_halo_rows(x, w, width_halo: int = 0):
    """Row blocks (batch, channels, frames, rows, width) convolved as one image: each
    block's first and last rows come from the blocks above and below (zeros at the
    image's edges); ``width_halo`` columns of zeros each side (none where the blocks
    carry theirs)."""
    import jax.numpy as jnp

    edge = jnp.zeros_like(x[:1, :, :, :1])
    above = jnp.concatenate([edge, x[:-1, :, :, -1:]])
    below = jnp.concatenate([x[1:, :, :, :1], edge])
    padded = jnp.concatenate([above, x, below], axis=3)
    return conv(padded, w, FIRST, ((0, 0), (0, 0), (width_halo, width_halo)))


def measure(name: str, target, channels: int, frames: int, height: int, width: int,
            dtype: str, blocks: int | None = None) -> dict:
    """One form compiled for ``target``: the compiler's cycles by kind, XLA's FLOPs and
    bytes a chip, and the compile's seconds."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    fn, shape, weights, split, mesh = form(name, target, channels, frames, height, width,
                                           blocks)
    x = jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, split))
    w = jax.ShapeDtypeStruct(weights, dtype, sharding=NamedSharding(mesh, P()))
    start = time.perf_counter()
    compiled = jax.jit(fn, out_shardings=NamedSharding(mesh, split)).lower(x, w).compile()
    seconds = time.perf_counter() - start
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    kinds = collections.Counter()
    for estimate in hlo.estimated_cycles(compiled.as_text()):
        kinds[estimate.kind] += estimate.cycles
    return {"form": name, "cycles": sum(kinds.values()), "by_kind": dict(kinds.most_common()),
            "flops_per_chip": float(cost.get("flops", 0.0)),
            "bytes_per_chip": float(cost.get("bytes accessed", 0.0)),
            "compile_s": round(seconds, 1)}


def render(rows: list[dict]) -> str:
    kinds = list(dict.fromkeys(kind for row in rows for kind in row["by_kind"]))
    lines = ["form            M cycles  GFLOP  GB a chip  " + "  ".join(kinds)]
    for row in rows:
        shares = "  ".join(f"{row['by_kind'].get(kind, 0) / 1e6:{len(kind)}.2f}"
                           for kind in kinds)
        lines.append(f"{row['form']:15s} {row['cycles'] / 1e6:8.2f} "
                     f"{row['flops_per_chip'] / 1e9:6.1f} "
                     f"{row['bytes_per_chip'] / 1e9:10.3f}  {shares}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="v6e-8", help="a TPU slice (porter compile's)")
    parser.add_argument("--channels", type=int, default=96)
    parser.add_argument("--frames", type=int, default=4, help="output frames")
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--blocks", type=int, default=row_blocks.BLOCKS,
                        help="row blocks of blocks-split-width (default: %(default)s, "
                             "Porter's)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--forms", nargs="+", default=list(FORMS), choices=FORMS)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--save", type=Path, metavar="FILE",
                        help="append this run (settings and rows) to FILE's records")
    args = parser.parse_args(argv)
    host_compiles()  # before JAX starts: the CPU runs it, libtpu describes the target
    target = targets.named(args.target)
    if args.width % target.chips or args.height % target.chips:
        parser.error(f"--height and --width must divide by {target.name}'s "
                     f"{target.chips} chips")
    if args.height % args.blocks:
        parser.error(f"--height ({args.height}) must divide into --blocks ({args.blocks})")
    rows = [measure(name, target, args.channels, args.frames, args.height, args.width,
                    args.dtype, args.blocks) for name in args.forms]
    print(json.dumps(rows, indent=1) if args.json else render(rows))
    if args.save:
        records = json.loads(args.save.read_text()) if args.save.exists() else []
        settings = {k: v for k, v in vars(args).items() if k not in ("json", "save")}
        save(args.save, records + [{"date": datetime.date.today().isoformat(),
                                    **settings, "rows": rows}])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
