"""A Porter run in a fresh process that also keeps its raw frames (the mp4 is
lossy): ``porter_frames.py FRAMES.npy RECIPE [KEY=VALUE ...]``."""

import sys

import numpy as np


def main(frames_file: str, recipe_file: str, *overrides: str) -> None:
    from porter import registry as registry_mod, recipe, runtime
    from porter.commands.run import run

    loaded = recipe.load(recipe_file, list(overrides))
    runtime.configure(loaded.runtime.platform, loaded.runtime.cpu_devices)
    result = run(loaded, registry_mod.loaded(), progress=False)
    np.save(frames_file, result.frames)


if __name__ == "__main__":
    main(*sys.argv[1:])
