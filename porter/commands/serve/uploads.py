"""Input files a server's client gives (images, videos, masks: ``porter.recipe.inputs.INPUTS``):
the file's bytes in the request (a data URL), or the name of a file in the folder
the operator named (``porter serve --inputs DIR``).

A server reads no other path. A client cannot make it open ``/etc/passwd``, follow
a link or ``..`` out of the inputs folder, or learn which paths exist: every name
that is not a readable image or video in that folder gets the same answer.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import re
import stat
from pathlib import Path

from porter.errors import UsageError
from porter.recipe.inputs import INPUTS, MAX_FRAMES, PATH_KEYS

#: generate settings that name an input file
INPUT_KEYS = tuple(INPUTS)
#: bytes one image may have (a 1280x720 PNG is about 2 MB)
MAX_IMAGE_BYTES = 4 * 2**20
#: bytes one video may have (81 frames of 720p H.264 are a few MB)
MAX_VIDEO_BYTES = 64 * 2**20
#: pixels one image may have: decoding costs memory before any check on its size
MAX_PIXELS = 8192 * 8192
#: image formats a run reads (PIL's names)
FORMATS = {"PNG": ".png", "JPEG": ".jpg", "MPO": ".jpg", "WEBP": ".webp", "BMP": ".bmp"}
#: video containers a run reads (PyAV's names; a container may have several)
VIDEO_FORMATS = {"mov,mp4,m4a,3gp,3g2,mj2": ".mp4", "matroska,webm": ".webm", "gif": ".gif"}

_DATA_URL = re.compile(r"data:(?:(?:image|video)/[A-Za-z0-9.+-]+)?(?:;[^,;]*)*;base64,",
                       re.ASCII)
_SEND_BYTES = "send the file's bytes as a data URL: \"data:image/png;base64,<the file in " \
              "base64>\" (data:video/mp4;base64,... for a video)"


def take(settings: dict, inputs: Path | None) -> dict[str, tuple[bytes, str]]:
    """The input files a request's ``settings`` give: ``{key: (bytes, file suffix)}``.
    Raises UsageError for a value that is neither a data URL nor the name of a file in
    ``inputs`` (None: the server reads no file a client names) of the kind the key
    takes. Condition objects and latents (``PATH_KEYS``) name their files by path,
    which a server does not read: a request cannot set them; the recipe's values apply."""
    for key in PATH_KEYS:
        if settings.get(key) is not None:
            raise UsageError(f"{key}: a request cannot set it (it names files by path, "
                             "and a server reads no path a client names)",
                             hint=f"set generate.{key} in the recipe the server loads")
    return {key: _input(key, settings[key], inputs) for key in INPUT_KEYS
            if settings.get(key) is not None}


def _limit(key: str) -> int:
    return MAX_IMAGE_BYTES if INPUTS[key] == "image" else MAX_VIDEO_BYTES


def _input(key: str, value, inputs: Path | None) -> tuple[bytes, str]:
    if not isinstance(value, str):
        raise UsageError(f"{key}: expected a string (a data URL or a file name), got "
                         f"{type(value).__name__}", hint=_SEND_BYTES)
    if _DATA_URL.match(value):
        data = _from_data_url(key, value)
    elif inputs is None:
        raise UsageError(f"{key}: this server reads no file a request names",
                         hint=_SEND_BYTES)
    else:
        data = _from_inputs(key, value, Path(inputs))
    return data, _suffix(key, data)


def _from_data_url(key: str, value: str) -> bytes:
    payload = value[_DATA_URL.match(value).end():]
    if len(payload) * 3 // 4 > _limit(key):
        raise UsageError(f"{key}: the file is larger than {_limit(key) >> 20} MiB",
                         hint="send a smaller file (a run resizes it to the video's size)")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise UsageError(f"{key}: the data URL's base64 does not decode: {exc}",
                         hint=_SEND_BYTES) from None


def _from_inputs(key: str, name: str, inputs: Path) -> bytes:
    """The bytes of ``inputs/name``, with links followed before the check that the
    file lies in ``inputs``; one answer for every other name, whether it exists or not."""
    what = {"image": "image", "video": "video"}.get(INPUTS[key], "input")
    refused = UsageError(f"{key}: no {what} file {name[:200]!r} in this server's inputs "
                         "folder", hint="name a file in that folder, relative to it (links "
                         "may not lead out of it); or " + _SEND_BYTES)
    try:
        root = inputs.resolve(strict=True)
        path = (root / name).resolve()
        if not path.is_relative_to(root):
            raise refused
        # O_NOFOLLOW: a link put in the file's place after resolve() is not followed
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (OSError, ValueError, RuntimeError):  # missing, a loop, NUL, too long
        raise refused from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or not _opened_in(fd, root):
            raise refused  # a folder, a FIFO, a device; or a folder on the way swapped
        if info.st_size > _limit(key):
            raise UsageError(f"{key}: {name!r} is larger than {_limit(key) >> 20} MiB",
                             hint="use a smaller file (a run resizes it to the video's "
                                  "size)")
        with os.fdopen(os.dup(fd), "rb") as file:
            return file.read(_limit(key) + 1)  # _suffix refuses a cut file
    finally:
        os.close(fd)


def _opened_in(fd: int, root: Path) -> bool:
    """The file ``fd`` opened lies in ``root`` (O_NOFOLLOW guards the last name only:
    a folder on the way could have become a link after resolve())."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}")).is_relative_to(root)
    except OSError:  # no /proc: resolve() was the check
        return True


def _suffix(key: str, data: bytes) -> str:
    """The file suffix of an input of the kind ``key`` takes that reads in full;
    UsageError for anything else."""
    kind = INPUTS[key]
    if kind == "image":
        return _image_suffix(key, data)
    if kind == "either":
        try:
            return _image_suffix(key, data)
        except UsageError:
            pass  # a video of masks, or neither: the video check says which
    return _video_suffix(key, data)


def _video_suffix(key: str, data: bytes) -> str:
    """The file suffix of a video PyAV decodes in full (every frame; not too many, not
    too large); UsageError for anything else."""
    import av

    try:
        with av.open(io.BytesIO(data)) as container:
            kind = container.format.name
            if kind not in VIDEO_FORMATS:
                raise UsageError(f"{key}: not a video this server can read (a {kind} "
                                 "file); runs read MP4, WebM and GIF videos",
                                 hint="send an .mp4 file")
            count = 0
            for frame in container.decode(container.streams.video[0]):
                count += 1
                if count > MAX_FRAMES or frame.width * frame.height > MAX_PIXELS:
                    raise UsageError(f"{key}: more frames or pixels than this server "
                                     "decodes", hint="send a shorter or smaller video")
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - PyAV raises many kinds
        raise UsageError(f"{key}: not a video this server can read: {exc}",
                         hint=_SEND_BYTES) from None
    if not count:
        raise UsageError(f"{key}: the video has no frames", hint=_SEND_BYTES)
    return VIDEO_FORMATS[kind]


def _image_suffix(key: str, data: bytes) -> str:
    """The file suffix of an image PIL can read in full; UsageError for anything else
    (not an image, cut short, too many pixels)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            kind, (width, height) = image.format, image.size
            if kind not in FORMATS:
                raise UsageError(f"{key}: a {kind} image; runs read "
                                 f"{', '.join(FORMATS)}", hint="send a PNG or a JPEG")
            if width * height > MAX_PIXELS:
                raise UsageError(f"{key}: {width}x{height} pixels is more than this server "
                                 "decodes", hint="send a smaller image")
            image.load()  # the whole image decodes: a cut file is refused here
    except UsageError:
        raise
    except Image.UnidentifiedImageError:  # its message shows Python's file object
        raise UsageError(f"{key}: the bytes are not an image (runs read "
                         f"{', '.join(FORMATS)})", hint=_SEND_BYTES) from None
    except Exception as exc:  # noqa: BLE001 - PIL raises many kinds (even SyntaxError)
        raise UsageError(f"{key}: not an image this server can read: {exc}",
                         hint=_SEND_BYTES) from None
    return FORMATS[kind]
