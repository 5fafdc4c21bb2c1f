"""Reading the input files a recipe names: first and last frames, input videos,
masks and control videos (``generate.<key>``, ``INPUTS``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from porter.errors import UsageError

#: generate settings that name an input file -> what it holds: an image, a video, or
#: either (a mask: one image for every frame, or a video of masks)
INPUTS = {"image": "image", "last_image": "image", "video": "video", "mask": "either",
          "control_video": "video", "pose_video": "video", "face_video": "video",
          "background_video": "video"}
#: generate keys whose files only a recipe names (a server's request cannot: a server
#: reads no path a client gives): condition objects' media, another run's latents
PATH_KEYS = ("conditions", "reference_conditions", "latents")
#: each kind of input file, as hints name it
KIND_NAMES = {"image": "an image file", "video": "a video file or a folder of frames",
              "either": "an image, a video file or a folder of frames"}
#: image files a run reads (PIL opens them); a folder of them is a video
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
#: frames one input video may have (each is decoded into memory)
MAX_FRAMES = 4096


def load_image(path):
    """The image at ``path`` as an RGB PIL image; UsageError naming the file if it
    cannot be read as one."""
    from PIL import Image, UnidentifiedImageError

    try:
        return Image.open(path).convert("RGB")
    except (OSError, UnidentifiedImageError) as exc:
        raise UsageError(f"cannot read image {str(path)!r}: {exc}",
                         hint="give a PNG or JPEG file") from None


def load_video(path) -> list:
    """The video at ``path`` as a list of RGB PIL images, the form diffusers' video
    pipelines take: a folder's image files in name order, or a video file's frames."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise UsageError(f"{str(path)!r} holds no image frames",
                             hint="a video folder holds its frames as PNG or JPEG files, "
                             "in name order (00000.png, 00001.png, ...)")
        if len(files) > MAX_FRAMES:
            raise UsageError(f"{str(path)!r} holds {len(files)} frames, more than "
                             f"{MAX_FRAMES}")
        return [load_image(file) for file in files]
    return _decoded(path)


def _decoded(path: Path) -> list:
    import av

    frames = []
    try:
        with av.open(str(path)) as container:
            for frame in container.decode(container.streams.video[0]):
                frames.append(frame.to_image().convert("RGB"))
                if len(frames) > MAX_FRAMES:
                    raise UsageError(f"{str(path)!r} has more than {MAX_FRAMES} frames")
    except (av.FFmpegError, IndexError, OSError) as exc:
        raise UsageError(f"cannot read video {str(path)!r}: {exc}",
                         hint="give a folder of PNG frames or an .mp4/.webm/.gif "
                         "file") from None
    if not frames:
        raise UsageError(f"{str(path)!r} holds no frames")
    return frames


def load_input(key: str, path):
    """``generate.<key>``'s file as its pipeline takes it: a PIL image for an image, a
    list of them for a video (a mask given as one image stays one image)."""
    return load(INPUTS[key], path)


def load(kind: str, path):
    """A file of one kind (``KIND_NAMES``): a PIL image, a list of them for a video,
    and for ``either`` whichever the file is."""
    if kind == "either":
        return load_media(path)
    return load_image(path) if kind == "image" else load_video(path)


def latents_names(path) -> None:
    """Check that ``path`` is a safetensors file holding a tensor named ``latents`` (a
    run's ``latents.safetensors``), reading its header only; UsageError naming the file
    if not."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as file:
            names = list(file.keys())
    except (SafetensorError, OSError) as exc:
        raise UsageError(f"cannot read latents from {str(path)!r}: {exc}",
                         hint=_LATENTS_HINT) from None
    if "latents" not in names:
        raise UsageError(f"{str(path)!r} holds no tensor named latents "
                         f"(it holds {', '.join(names) or 'none'})", hint=_LATENTS_HINT)


_LATENTS_HINT = "give a run's latents.safetensors (output.latents: true writes it)"


def load_latents(path):
    """Another run's final latents (its ``latents.safetensors``, key ``latents``) as a
    host tensor; UsageError naming the file when it holds none."""
    import torch
    from safetensors.torch import load_file
    from torch.utils._python_dispatch import _disable_current_modes

    latents_names(path)
    with _disable_current_modes(), torch._C.DisableTorchFunction():  # read on the host:
        return load_file(str(path))["latents"]  # torchax cannot make tensors of storages


def as_tensor(frames, mask: bool = False):
    """Frames (a list of PIL images, or one) as the 5-D tensor pipelines that take no
    images want: batch 1 x channels x frames x height x width, float; a video's RGB in
    [0, 1], a mask's one channel in 0 and 255, 255 where to generate (EasyAnimate
    inpaint's, as its own helper makes them)."""
    import torch

    channels, scale = (1, 1.0) if mask else (3, 1 / 255)
    frames = frames if isinstance(frames, list) else [frames]
    array = np.stack([np.asarray(f.convert("L" if mask else "RGB"), dtype=np.float32)
                      .reshape(f.height, f.width, channels) for f in frames]) * scale
    return torch.from_numpy(array).permute(3, 0, 1, 2)[None]


def load_media(path):
    """An image file as one PIL image; a video file or a folder of frames as a list."""
    if Path(path).suffix.lower() in IMAGE_SUFFIXES:
        return load_image(path)
    return load_video(path)
