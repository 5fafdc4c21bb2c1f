"""What a denoising loop carries from step to step besides the latents and the
scheduler: the run's random stream and the family's own state.

One seeded CPU generator serves a run as it serves a diffusers pipeline: the
initial noise is drawn from it, then a stochastic scheduler (CogVideoX's
DPM-Solver) draws from it every step. ``carry`` holds tensors a family's step
passes to the next one (DPM-Solver's previous prediction of the clean sample).
Both go into each denoising checkpoint, so a resumed run draws what the
uninterrupted run would have drawn.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Sampling:
    generator: torch.Generator
    timesteps: object = None  # the schedule being run
    index: int = 0  # the step under way (0-based)
    carry: dict = field(default_factory=dict)  # name -> tensor (or None: not yet set)

    @classmethod
    def seeded(cls, seed: int) -> "Sampling":
        return cls(torch.Generator("cpu").manual_seed(seed))

    def state(self) -> dict:
        """Tensors for a checkpoint: the generator's state and each carried tensor."""
        return {"generator": self.generator.get_state(),
                **{f"carry.{k}": v for k, v in self.carry.items() if v is not None}}

    def restore(self, tensors: dict, to_device) -> None:
        """Put a checkpoint's ``state()`` back (a checkpoint without a generator state,
        from before it was kept, leaves the seeded stream as it is)."""
        if "generator" in tensors:
            self.generator.set_state(tensors["generator"].to(torch.uint8).contiguous())
        prefix = "carry."
        self.carry.update({k[len(prefix):]: to_device(v) for k, v in tensors.items()
                           if k.startswith(prefix)})
