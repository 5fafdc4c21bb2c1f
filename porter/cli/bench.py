"""porter bench: one step of the port timed beside PyTorch eager."""

from __future__ import annotations

import json

from porter.cli import common

HELP = "time one step of the port beside PyTorch eager"


def add(commands) -> None:
    parser = commands.add_parser(
        "bench", help=HELP,
        description="Compile time, steady step time of the ported transformer and of the "
        "same transformer in PyTorch eager (same device, same inputs) and their ratio "
        "(with --torch-compile, under torch.compile too), "
        "peak memory, FLOPs per step and the fraction of a measured matmul peak. With a "
        "cache: section, also the recipe's denoise stage (its steps) with and without "
        "the cache: wall time, blocks computed, steps skipped, how far the latents moved. "
        "With --video: a whole video instead (load, then cold and warm, by stage) beside "
        "diffusers' pipeline making the same video on the same machine.")
    common.recipe_args(parser, json=True)
    parser.add_argument("--steps", type=common.positive, default=5, metavar="N",
                        help="timed steps after the first (default 5)")
    parser.add_argument("--video", action="store_true",
                        help="time a whole video of the recipe (text encoding, steps, "
                        "decode) cold and warm, beside diffusers' own pipeline")
    parser.add_argument("--torch-compile", action="store_true",
                        help="also time the PyTorch model under torch.compile (default "
                        "mode; its first call, which compiles, is reported apart)")


def handle(args) -> int:
    # lazy: only the subcommand asked for is imported
    from porter import registry as registry_mod
    from porter.commands import bench  # lazy: only the subcommand asked for is imported

    loaded = common.load_recipe(args)
    if args.video:
        from porter.commands.bench import video  # lazy: only the mode asked for

        result = video.bench_video(loaded, registry_mod.loaded(),
                                   torch_compile=args.torch_compile)
        print(json.dumps(result, indent=2) if args.json else video.render(result))
        return 0
    result = bench.bench(loaded, registry_mod.loaded(), steps=args.steps,
                         torch_compile=args.torch_compile)
    print(json.dumps(result, indent=2) if args.json else bench.render(result))
    return 0
