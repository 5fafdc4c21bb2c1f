"""A port's VAE decode of given latents, in a fresh process on N CPU devices:
``decode_latents.py [--warm] RECIPE LATENTS OUT DEVICES [KEY=VALUE ...]``.

LATENTS is a safetensors file holding ``latents`` (the pipeline's layout, as a run's
denoise.safetensors holds them). The decode runs as a run's does (the family's
``decode`` inside the port's call-time passes). Writes OUT (.npz): ``frames`` (uint8,
the family's result), ``video`` (float32: the VAE's own output, as the family hands
it to the pipeline's video processor), the seconds of the first decode (compiling
included, ``cold_s``), with ``--warm`` those of a second (``warm_s``: a benchmark's; a
test needs one decode), and the process's peak RSS."""

import resource
import sys
import time

import numpy as np


def main(recipe_file: str, latents_file: str, out: str, devices: str, *overrides: str,
         warm: bool = False):
    from safetensors.torch import load_file

    import porter

    latents = load_file(latents_file)["latents"]
    port = porter.load(recipe_file, *overrides, cpu_devices=int(devices))
    seen = []
    processor = port.pipe.video_processor
    postprocess = processor.postprocess_video

    def kept(video, **kwargs):  # the VAE's output, before it becomes uint8
        seen.append(video.float().numpy())
        return postprocess(video, **kwargs)
    processor.postprocess_video = kept
    seconds = []
    with port.active() as env, env:
        for _ in range(2 if warm else 1):
            start = time.perf_counter()
            frames = port.family.decode(port.pipe, latents, port.recipe)
            seconds.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    timed = {"cold_s": seconds[0], **({"warm_s": seconds[1]} if warm else {})}
    np.savez(out, frames=frames, video=seen[-1], peak_rss_bytes=peak, **timed)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(*[a for a in arguments if a != "--warm"], warm="--warm" in arguments)
