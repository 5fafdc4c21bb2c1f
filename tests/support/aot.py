"""What the TPU compile tests share: libtpu, the assets recipes name."""

import importlib.util

import pytest

from support import RECIPES

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="compiling for a TPU needs libtpu: "
                                         "pip install -e '.[tpu]'")


IMAGE = str(RECIPES / "assets" / "first_frame.png")


LAST = str(RECIPES / "assets" / "last_frame.png")
