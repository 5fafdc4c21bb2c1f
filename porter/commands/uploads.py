"""Images a server's client gives: the image's bytes in the request (a data URL), or
the name of a file in the folder the operator named (``porter serve --inputs DIR``).

A server reads no other path. A client cannot make it open ``/etc/passwd``, follow
a link or ``..`` out of the inputs folder, or learn which paths exist: every name
that is not a readable image in that folder gets the same answer.
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

#: generate settings that name an image file
IMAGE_KEYS = ("image", "last_image")
#: bytes one image may have (a 1280x720 PNG is about 2 MB)
MAX_IMAGE_BYTES = 4 * 2**20
#: pixels one image may have: decoding costs memory before any check on its size
MAX_PIXELS = 8192 * 8192
#: image formats a run reads (PIL's names)
FORMATS = {"PNG": ".png", "JPEG": ".jpg", "MPO": ".jpg", "WEBP": ".webp", "BMP": ".bmp"}

_DATA_URL = re.compile(r"data:(?:image/[A-Za-z0-9.+-]+)?(?:;[^,;]*)*;base64,", re.ASCII)
_SEND_BYTES = "send the image's bytes as a data URL: \"data:image/png;base64,<the file " \
              "in base64>\""


def take(settings: dict, inputs: Path | None) -> dict[str, tuple[bytes, str]]:
    """The images a request's ``settings`` give: ``{key: (bytes, file suffix)}``.
    Raises UsageError for a value that is neither an image's data URL nor the name of
    an image file in ``inputs`` (None: the server reads no file a client names)."""
    return {key: _image(key, settings[key], inputs) for key in IMAGE_KEYS
            if settings.get(key) is not None}


def _image(key: str, value, inputs: Path | None) -> tuple[bytes, str]:
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
    if len(payload) * 3 // 4 > MAX_IMAGE_BYTES:
        raise UsageError(f"{key}: the image is larger than {MAX_IMAGE_BYTES >> 20} MiB",
                         hint="send a smaller image (a run resizes it to the video's size)")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise UsageError(f"{key}: the data URL's base64 does not decode: {exc}",
                         hint=_SEND_BYTES) from None


def _from_inputs(key: str, name: str, inputs: Path) -> bytes:
    """The bytes of ``inputs/name``, with links followed before the check that the
    file lies in ``inputs``; one answer for every other name, whether it exists or not."""
    refused = UsageError(f"{key}: no image file {name[:200]!r} in this server's inputs "
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
        if info.st_size > MAX_IMAGE_BYTES:
            raise UsageError(f"{key}: {name!r} is larger than {MAX_IMAGE_BYTES >> 20} MiB",
                             hint="use a smaller image (a run resizes it to the video's "
                                  "size)")
        with os.fdopen(os.dup(fd), "rb") as file:
            return file.read(MAX_IMAGE_BYTES + 1)  # _suffix refuses a cut image
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
    except Exception as exc:  # noqa: BLE001 - PIL raises many kinds (even SyntaxError)
        raise UsageError(f"{key}: not an image this server can read: {exc}",
                         hint=_SEND_BYTES) from None
    return FORMATS[kind]
