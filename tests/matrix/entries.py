"""What the pipeline matrix says of each diffusers video pipeline class, one entry
per class: it matches plain diffusers from a recipe (``Matches``), a plugin family
runs it with its own tests (``Family``), or ``porter validate`` refuses it with a
message naming why (``Refused``). ``tests/e2e/test_pipeline_matrix.py`` proves each
entry; ``docs/pipelines.md`` is written from them (``python tests/matrix/page.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: placeholders in ``Matches.generate`` / ``Matches.call`` the test replaces with inputs
#: it writes: an RGB image (PNG), a video (a folder of PNG frames), a mask video, latents
#: (a safetensors file, as a run writes them: ``Matches.latents_shape``)
IMAGE, VIDEO, MASK, LATENTS = "<image>", "<video>", "<mask>", "<latents>"


@dataclass
class Conditions:
    """In ``Matches.call``: a list of the pipeline's condition objects for plain
    diffusers, of the class at ``cls`` (module:name), each from its fields (placeholders
    filled), as a user of diffusers writes them."""
    cls: str
    items: list


@dataclass
class AsTensor:
    """In ``Matches.call``: an input (a placeholder) as a diffusers user gives it to a
    pipeline that takes tensors only: batch 1 x channels x frames x height x width,
    float, the pixel values divided by ``divisor`` (EasyAnimate's own helper gives the
    video in [0, 1] and the mask in 0 and 255)."""
    placeholder: str
    channels: int = 3
    divisor: float = 255.0


@dataclass
class Matches:
    """Runs from a recipe of ``model`` (family generic) and ``generate`` (plus
    ``setup`` where given) and equals plain diffusers from the same seed."""
    builder: str  # tests/models/<builder>.py: build_<builder>_pipeline()
    generate: dict  # the recipe's generate section (prompt "a cat" and seed 0 added
    #                 unless the entry sets prompt: None, for pipelines with no prompt)
    call: dict  # the same settings under the pipeline's own names, for plain diffusers
    setup: dict = field(default_factory=dict)  # the recipe's setup section
    input_size: tuple[int, int, int] = (9, 16, 16)  # frames, height, width of the inputs
    latents_shape: tuple[int, ...] = (1, 8, 2, 3, 3)  # of the latents input
    note: str = ""  # what the recipe needs and why, for the docs page
    tolerance: int = 1  # largest difference of a uint8 pixel


@dataclass
class Family:
    """Run by a plugin family (``model.family``), whose own tests compare it with
    plain diffusers."""
    family: str
    tests: str  # the test file that compares it


@dataclass
class Refused:
    """``porter validate`` refuses a recipe that names it in ``model.pipeline`` (with
    ``generate`` settings added), with ``reason`` in the message."""
    reason: str
    generate: dict = field(default_factory=dict)
    note: str = ""  # why, for the docs page


@dataclass
class NotVideo:
    """Found by the test's rule for video pipelines (frames in its output) but makes
    images."""
    note: str


@dataclass
class Untested:
    """Found, not run here yet: a gap the docs page shows as one."""
    note: str
