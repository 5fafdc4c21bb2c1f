"""Run one matrix entry: the tiny pipeline built and saved, run by Porter from its
recipe and by plain diffusers from the same seed, frames compared.

    python tests/matrix/check.py CLASS [CLASS ...]    # one process, each in turn
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: models.<builder>, matrix.<group>

from matrix import entries  # noqa: E402
from porter.recipe import modular  # noqa: E402
from porter.rundir import audio  # noqa: E402
from matrix.entries import IMAGE, LATENTS, MASK, VIDEO  # noqa: E402

GROUPS = ("core", "wan", "ltx_hunyuan", "others", "unet", "modular")
COMMON = {"prompt": "a cat", "seed": 0}
#: the largest difference of a sound sample (in [-1, 1]) from diffusers': float32 on
#: another backend, as the frames' one pixel level is
SOUND_TOLERANCE = 1e-3
#: a modular pipeline's guidance scales, on the guiders diffusers' docs set them on
GUIDERS = {"guidance_scale": "guider", "guidance_scale_2": "guider_2"}


def matrix() -> dict:
    """class name -> entry, over every group module present."""
    found = {}
    for group in GROUPS:
        try:
            module = importlib.import_module(f"matrix.{group}")
        except ModuleNotFoundError as exc:
            if exc.name != f"matrix.{group}":
                raise
            continue
        for name, entry in module.ENTRIES.items():
            assert name not in found, f"{name} is in two groups"
            found[name] = entry
    return found


def installed() -> list[str]:
    """The video pipeline classes the installed diffusers exports: a pipeline whose call
    takes a frame count or a video, or whose package's output has ``frames``; a modular
    pipeline whose blocks give ``videos``. (A class
    diffusers replaces with a placeholder for a missing library is not found here; the
    matrix lists those it knows.)"""
    import inspect

    import diffusers

    found = []
    for name in dir(diffusers):
        cls = getattr(diffusers, name, None)
        if not (name.endswith("Pipeline") and isinstance(cls, type)):
            continue
        if modular.is_modular(cls):  # its blocks say what it makes
            if cls.default_blocks_name and "videos" in modular.outputs(cls):
                found.append(name)
            continue
        taken = inspect.signature(cls.__call__).parameters
        if {"num_frames", "video_length", "frames", "video"} & set(taken) \
                or _frames_in_output(cls):
            found.append(name)
    return found


def _frames_in_output(cls) -> bool:
    import dataclasses

    package = cls.__module__.rsplit(".", 1)[0]
    try:
        output = importlib.import_module(f"{package}.pipeline_output")
    except ImportError:
        return False
    return any(isinstance(value, type) and dataclasses.is_dataclass(value)
               and "frames" in {f.name for f in dataclasses.fields(value)}
               for value in vars(output).values())


def build(builder: str):
    module = importlib.import_module(f"models.{builder}")
    return getattr(module, f"build_{builder}_pipeline")()


def write_inputs(folder: Path, size, latents_shape=(1, 8, 2, 3, 3)) -> dict:
    """The input files a recipe names (placeholder -> path) and what plain diffusers
    gets for them (placeholder -> PIL images, or a tensor for latents), the same
    values."""
    import torch
    from PIL import Image
    from safetensors.torch import save_file

    frames, height, width = size
    rng = np.random.default_rng(0)
    video = rng.integers(0, 256, (frames, height, width, 3), dtype=np.uint8)
    mask = np.where(rng.random((frames, height, width, 1)) < 0.5, 0, 255).astype(np.uint8)
    mask = np.repeat(mask, 3, axis=-1)
    paths, given = {}, {}
    for key, array in ((VIDEO, video), (MASK, mask)):
        path = folder / key.strip("<>")
        path.mkdir(parents=True, exist_ok=True)
        for i, frame in enumerate(array):
            Image.fromarray(frame).save(path / f"{i:05d}.png")
        paths[key], given[key] = str(path), [Image.fromarray(frame) for frame in array]
    Image.fromarray(video[0]).save(folder / "image.png")
    paths[IMAGE], given[IMAGE] = str(folder / "image.png"), Image.fromarray(video[0])
    latents = torch.randn(latents_shape, generator=torch.Generator().manual_seed(1))
    save_file({"latents": latents}, folder / "latents.safetensors")
    paths[LATENTS], given[LATENTS] = str(folder / "latents.safetensors"), latents
    return paths, given


def _filled(settings: dict, values: dict) -> dict:
    return {key: _fill(value, values) for key, value in settings.items()}


def _fill(value, values: dict):
    """``value`` with its placeholders replaced, in lists and mappings too; condition
    objects built."""
    if isinstance(value, entries.AsTensor):
        import torch

        mode = "L" if value.channels == 1 else "RGB"
        frames = np.stack([np.asarray(f.convert(mode), dtype=np.float32)
                           for f in values[value.placeholder]]).reshape(
            len(values[value.placeholder]), *np.asarray(values[value.placeholder][0]).shape[:2],
            value.channels)
        return torch.from_numpy(frames / value.divisor).permute(3, 0, 1, 2)[None]
    if isinstance(value, entries.Conditions):
        module, name = value.cls.split(":")
        cls = getattr(importlib.import_module(module), name)
        return [cls(**_filled(item, values)) for item in value.items]
    if isinstance(value, list):
        return [_fill(item, values) for item in value]
    if isinstance(value, dict):
        return _filled(value, values)
    return values.get(value, value) if isinstance(value, str) else value


def recipe_text(entry, source, inputs: dict, pipeline: str | None = None) -> dict:
    """The recipe of a matrix run; ``pipeline``: its model.pipeline (a modular class
    run from a checkpoint that may be a classic one)."""
    generate = {**COMMON, **_filled(entry.generate, inputs)}
    generate = {key: value for key, value in generate.items() if value is not None}
    text = {"model": {"family": "generic", "source": str(source)}, "generate": generate}
    if pipeline is not None:
        text["model"]["pipeline"] = pipeline
    if getattr(entry, "setup", None):
        text["setup"] = entry.setup
    return text


class Made(NamedTuple):
    """A run's frames (uint8) and its sound (float32 (channels, samples), or None)."""
    frames: np.ndarray
    sound: np.ndarray | None


def porter_frames(entry, source, folder: Path, inputs: dict,
                  pipeline: str | None = None) -> Made:
    """Porter's run of the entry's recipe; its sound as the lossless file has it."""
    import yaml

    from porter import registry as registry_mod, recipe
    from porter.commands.run import run
    from porter.commands.validate import validate

    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe_text(entry, source, inputs, pipeline)))
    loaded = recipe.load(path, [f"output.dir={folder / 'out'}", "output.wav=true"])
    problems = validate(loaded, registry_mod.loaded())
    assert problems == [], [p.render() if hasattr(p, "render") else str(p) for p in problems]
    result = run(loaded, registry_mod.loaded(), progress=False)
    wav = result.directory / "audio.wav"
    return Made(result.frames, audio.read(wav).samples if wav.exists() else None)


def _waveform(waveform) -> np.ndarray | None:
    """diffusers' waveform as Porter writes one: (channels, samples), the first of a
    batch."""
    return None if waveform is None else audio.of(waveform, 1).samples


def without_accelerator():
    """PyTorch as a process without torchax sees it: torchax names PyTorch's extra
    device ``jax``, so torch.accelerator reports one, and torch.compile (which flex
    attention runs through) then asks it for a stream and fails. The reference runs
    are plain PyTorch on the CPU."""
    from unittest import mock

    import torch

    return mock.patch.object(torch.accelerator, "is_available", lambda: False)


def first_video(out):
    """The first video of a pipeline's output, whatever the output calls it."""
    video = next(getattr(out, name) for name in ("frames", "video", "images")
                 if getattr(out, name, None) is not None)
    return video[0] if isinstance(video, list) or np.ndim(video) == 5 else video


def modular_frames(name: str, entry, source, given: dict) -> Made:
    """A modular pipeline as diffusers' modular docs run one: the class from the
    checkpoint, its components loaded, the guidance scale on its guider."""
    import diffusers
    import torch

    pipe = getattr(diffusers, name)(pretrained_model_name_or_path=str(source))
    pipe.load_components(torch_dtype=torch.float32)
    call = {**{k: v for k, v in COMMON.items() if k != "seed"}, **_filled(entry.call, given)}
    for key, guider in GUIDERS.items():  # as diffusers' modular docs set a guidance scale
        if key in call:
            pipe.update_components(**{guider: getattr(pipe, guider).new(
                guidance_scale=call.pop(key))})
    if "output_type" in {param.name for param in pipe.blocks.inputs}:
        call["output_type"] = "np"
    torch.manual_seed(COMMON["seed"])
    with without_accelerator():
        out = pipe(generator=torch.Generator().manual_seed(COMMON["seed"]),
                   output=["videos", "audio", "sound"], **call)
    video = out["videos"]
    frames = video[0] if isinstance(video, list) or np.ndim(video) == 5 else video
    return Made((np.asarray(frames) * 255).round().clip(0, 255).astype("uint8"),
                _waveform(out.get("audio") if out.get("audio") is not None
                          else out.get("sound")))


def diffusers_frames(entry, source, given: dict) -> Made:
    import torch
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(source, torch_dtype=torch.float32)
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            component.eval()
    for component, calls in entry.setup.items():
        for method in calls:
            getattr(getattr(pipe, component), method)()
    call = {**{k: v for k, v in COMMON.items() if k != "seed"}, **_filled(entry.call, given)}
    if call.get("prompt", "") is None:
        del call["prompt"]  # a pipeline that takes none
    # what a pipeline draws with no generator (I2VGen-XL's VAE encode) comes from
    # PyTorch's global generator: seeded, the reference repeats
    torch.manual_seed(COMMON["seed"])
    with without_accelerator():
        out = pipe(generator=torch.Generator().manual_seed(COMMON["seed"]),
                   output_type="np", **call)
    frames = first_video(out)
    return Made((np.asarray(frames) * 255).round().clip(0, 255).astype("uint8"),
                _waveform(getattr(out, "audio", None) if getattr(out, "audio", None)
                          is not None else getattr(out, "sound", None)))


class Difference(NamedTuple):
    pixels: int  # the largest difference of a uint8 pixel
    sound: float | None  # the largest difference of a sample (None: neither made sound)


def compare(name: str, entry, folder: Path) -> Difference:
    """The largest differences between Porter's run and plain diffusers'."""
    import diffusers

    source = folder / "ckpt"
    built = build(entry.builder)
    if modular.is_modular(type(built)):  # a modular checkpoint (modular_model_index.json)
        built.save_pretrained(str(source), overwrite_modular_index=True)
    else:
        built.save_pretrained(source)
    inputs, given = write_inputs(folder / "inputs", entry.input_size, entry.latents_shape)
    if modular.is_modular(getattr(diffusers, name)):
        ours = porter_frames(entry, source, folder, inputs, pipeline=name)
        theirs = modular_frames(name, entry, source, given)
    else:
        ours = porter_frames(entry, source, folder, inputs)
        theirs = diffusers_frames(entry, source, given)
    assert ours.frames.shape == theirs.frames.shape, (ours.frames.shape, theirs.frames.shape)
    pixels = int(np.abs(ours.frames.astype(int) - theirs.frames.astype(int)).max())
    assert (ours.sound is None) == (theirs.sound is None), \
        f"sound from {'Porter' if theirs.sound is None else 'diffusers'} only"
    if ours.sound is None:
        return Difference(pixels, None)
    assert ours.sound.shape == theirs.sound.shape, (ours.sound.shape, theirs.sound.shape)
    return Difference(pixels, float(np.abs(ours.sound - theirs.sound).max()))


def runs(group: str) -> list[str]:
    """The classes of one group said to match."""
    module = importlib.import_module(f"matrix.{group}")
    return sorted(name for name, entry in module.ENTRIES.items()
                  if isinstance(entry, entries.Matches))


#: The classes every test run compares, CI's included: in each group the cheapest
#: (seconds, not a minute), covering its kinds of input (text, an image, a video,
#: latents) and its transformers; families Porter ports itself (HunyuanVideo, Mochi
#: as a generic run) have their own tests. A whole matrix takes about 50 minutes of
#: test time on 2 cores, more than a CI run may; the other classes carry the
#: ``matrix`` marker, which the default run deselects (pyproject.toml): ``pytest -m
#: matrix`` runs them.
EVERY_RUN = {
    # core
    "SanaVideoPipeline", "LattePipeline", "LTXLatentUpsamplePipeline",
    # ltx_hunyuan
    "LTXPipeline", "LTXImageToVideoPipeline", "LTX2LatentUpsamplePipeline",
    # others
    "EasyAnimatePipeline", "CogVideoXVideoToVideoPipeline", "SanaImageToVideoPipeline",
    "CosmosTextToWorldPipeline",
    # unet: one UNet, run op by op (a minute): the video-to-video class covers it
    "VideoToVideoSDPipeline",
    # wan, Porter's first target: text, image, video, VACE and diffusion forcing,
    # each under half a minute
    "SkyReelsV2Pipeline", "SkyReelsV2ImageToVideoPipeline", "SkyReelsV2DiffusionForcingPipeline",
    "LucyEditPipeline", "WanVideoToVideoPipeline", "AnyFlowPipeline", "WanVACEPipeline",
    # modular: Wan from a classic checkpoint, MiniMax-H3 (video with sound, a modular
    # checkpoint)
    "WanModularPipeline", "MiniMaxH3ModularPipeline",
}


def params(group: str) -> list:
    """``runs(group)`` as pytest parameters, those outside ``EVERY_RUN`` marked
    ``matrix``."""
    import pytest

    return [name if name in EVERY_RUN else pytest.param(name, marks=pytest.mark.matrix)
            for name in runs(group)]


def assert_matches(name: str, folder: Path) -> None:
    entry = matrix()[name]
    difference = compare(name, entry, folder)
    assert difference.pixels <= entry.tolerance, \
        f"{name}: frames differ by up to {difference.pixels}"
    assert difference.sound is None or difference.sound <= SOUND_TOLERANCE, \
        f"{name}: the sound differs by up to {difference.sound}"


if __name__ == "__main__":
    import os
    import tempfile
    import traceback

    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    known = matrix()
    for name in sys.argv[1:]:
        entry = known[name]
        with tempfile.TemporaryDirectory() as tmp:
            try:
                print(f"{name}: max difference {compare(name, entry, Path(tmp))}",
                      flush=True)
            except Exception:
                print(f"{name}: FAILED", flush=True)
                traceback.print_exc()
