"""Reading the image files a recipe names (first and last frames)."""

from __future__ import annotations

from porter.errors import UsageError


def load_image(path):
    """The image at ``path`` as an RGB PIL image; UsageError naming the file if it
    cannot be read as one."""
    from PIL import Image, UnidentifiedImageError

    try:
        return Image.open(path).convert("RGB")
    except (OSError, UnidentifiedImageError) as exc:
        raise UsageError(f"cannot read image {str(path)!r}: {exc}",
                         hint="give a PNG or JPEG file") from None
