"""Live previews: a cheap picture of the latents while denoising, no VAE decode a step.

Each pixel of a preview is a linear function of one latent position's channels
(``rgb = z . A + b``), the map that video tools use for Wan's and HunyuanVideo's
latents. Porter fits it to the model's own VAE rather than carrying tables: once
per port, the family's decode (the same path a run's frames take) turns a few random
latents of a small shape into frames, each latent cell's pixels are averaged, and
``A``, ``b`` are the least-squares fit of those colours to the latents. So the map
follows whatever VAE the checkpoint has; on random latents it is a rough picture
(colours and layout, not detail), as such maps are.

A preview is the middle latent frame of the first video of the batch, written as
``preview.png`` in the call's directory (whole or not at all) every
``output.preview_every`` steps. It reads the latents and changes nothing.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from porter.rundir import outputs

if TYPE_CHECKING:
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe

FILE = outputs.PREVIEW
#: the fit's latents: this many samples of (1 frame x SIDE x SIDE) latent cells
SAMPLES, SIDE = 4, 8
#: each latent cell becomes SCALE x SCALE pixels of the preview
SCALE = 4


@dataclass(frozen=True)
class LatentColours:
    """``rgb = z . weights + bias`` for one latent cell's channels ``z``, in 0..255."""
    weights: np.ndarray  # (channels, 3)
    bias: np.ndarray  # (3,)
    fit_s: float  # what the fit took (its decode compiles once)
    residual: float  # the fit's RMS error, in 0..255 levels

    def image(self, latents: torch.Tensor) -> np.ndarray:
        """(height, width, 3) uint8: the middle latent frame of the first video."""
        frame = latents[0, :, latents.shape[2] // 2].float().numpy()  # (C, h, w)
        rgb = np.einsum("chw,ck->hwk", frame, self.weights) + self.bias
        return np.clip(rgb, 0, 255).round().astype(np.uint8)


def fitted(family: ModelFamily, pipe, recipe: Recipe, channels: int) -> LatentColours:
    """The latent-to-RGB map of this pipeline's VAE (see the module's docstring)."""
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(0)
    cells, colours = [], []
    for _ in range(SAMPLES):
        z = torch.randn((1, channels, 1, SIDE, SIDE), generator=generator)
        frames = family.decode(pipe, z, recipe).astype(np.float64)  # (F, H, W, 3)
        first = frames[0]
        step_h, step_w = first.shape[0] // SIDE, first.shape[1] // SIDE
        pooled = first[:step_h * SIDE, :step_w * SIDE].reshape(
            SIDE, step_h, SIDE, step_w, 3).mean(axis=(1, 3))  # (SIDE, SIDE, 3)
        cells.append(z[0, :, 0].permute(1, 2, 0).reshape(-1, channels).double().numpy())
        colours.append(pooled.reshape(-1, 3))
    x = np.concatenate(cells)
    x = np.concatenate([x, np.ones((len(x), 1))], axis=1)
    y = np.concatenate(colours)
    solution, *_ = np.linalg.lstsq(x, y, rcond=None)
    residual = float(np.sqrt(np.mean((x @ solution - y) ** 2)))
    return LatentColours(solution[:-1], solution[-1], round(time.perf_counter() - start, 3),
                         round(residual, 2))


class Previews:
    """A port's live previews: the latent-to-RGB map, fitted at the first preview and
    kept; a preview that fails turns them off for the port (the video matters more
    than its picture)."""

    def __init__(self):
        self.colours: LatentColours | None = None
        self.off = False

    def image(self, family: ModelFamily, pipe, recipe: Recipe,
              latents: torch.Tensor) -> np.ndarray:
        """The preview of ``latents`` (host tensor); the map fitted first, once."""
        if self.colours is None:  # once per port: its decode compiles
            self.colours = fitted(family, pipe, recipe, latents.shape[1])
        return self.colours.image(latents)


def png(image: np.ndarray) -> bytes:
    """The image, each pixel SCALE x SCALE, as PNG bytes."""
    from PIL import Image  # lazy: only when previews are on

    picture = Image.fromarray(image).resize(
        (image.shape[1] * SCALE, image.shape[0] * SCALE), Image.NEAREST)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()
