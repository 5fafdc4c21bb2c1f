"""A stand-in for the Cosmos Guardrail safety checker (the cosmos_guardrail package, not
installed here, with models far too large for tests), as in diffusers' own Cosmos tests:
every prompt and every video is let through unchanged.

Every Cosmos pipeline refuses to run without a safety checker, and its constructor builds
cosmos_guardrail's CosmosSafetyChecker when given none; a saved pipeline holding this one
names it in model_index.json as ("models.cosmos_safety", "DummyCosmosSafetyChecker"), so it
loads wherever this module is importable (tests/ on sys.path, as in check.py)."""

import numpy as np
import torch
from diffusers.configuration_utils import ConfigMixin
from diffusers.models.modeling_utils import ModelMixin


class DummyCosmosSafetyChecker(ModelMixin, ConfigMixin):
    def __init__(self) -> None:
        super().__init__()
        # persistent (unlike the diffusers tests' one): save_pretrained then writes a
        # weights file, without which from_pretrained cannot load the component
        self.register_buffer("_device_tracker", torch.zeros(1, dtype=torch.float32))

    def check_text_safety(self, prompt: str) -> bool:
        return True

    def check_video_safety(self, frames: np.ndarray) -> np.ndarray:
        return frames

    @property
    def device(self) -> torch.device:
        return self._device_tracker.device

    @property
    def dtype(self) -> torch.dtype:
        return self._device_tracker.dtype
