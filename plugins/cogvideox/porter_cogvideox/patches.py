"""CogVideoX-specific patches, usable outside Porter in a ``with`` block."""

from __future__ import annotations

from porter.shims import lazy
from porter.transforms.patches import Patch

torch = lazy.module("torch", __name__)


def _host_rotary(original):
    cache: dict = {}

    def prepare(self, height, width, num_frames, device):
        # Built once per shape on the host (PyTorch, CPU), then moved: the tables
        # reach the compiled transformer as inputs, never computed on the device.
        key = (height, width, num_frames, type(self.transformer).__name__,
               self.transformer.config.attention_head_dim)
        if key not in cache:
            cache[key] = original(self, height, width, num_frames, torch.device("cpu"))
        return tuple(t.to(device) for t in cache[key])
    prepare.__doc__ = original.__doc__
    return prepare


ROTARY = Patch(
    name="cogvideox.rope_cache",
    target=("diffusers.pipelines.cogvideo.pipeline_cogvideox:"
            "CogVideoXPipeline._prepare_rotary_positional_embeddings"),
    doc="Build CogVideoX's 3D rotary tables on the host (PyTorch, CPU) once per "
        "resolution and frame count, then hand them to the device: they arrive at the "
        "compiled transformer as inputs.",
    replacement=_host_rotary, fits="diffusers>=0.30,<0.43")

ROTARY_I2V = Patch(
    name="cogvideox.rope_cache_i2v",
    target=("diffusers.pipelines.cogvideo.pipeline_cogvideox_image2video:"
            "CogVideoXImageToVideoPipeline._prepare_rotary_positional_embeddings"),
    doc="The same for CogVideoXImageToVideoPipeline.",
    replacement=_host_rotary, fits="diffusers>=0.30,<0.43")

ALL = (ROTARY, ROTARY_I2V)
