"""The tiny CogVideoX pipelines come in eval mode, as ``from_pretrained`` gives a
pipeline: plain diffusers given one is deterministic, so it can be a reference."""

import pytest
import torch

from support import in_training

from porter_cogvideox.tiny import build_pipeline


@pytest.mark.parametrize("version, image", [("1.0", False), ("1.5", False), ("1.0", True)])
def test_every_module_is_in_eval_mode(version, image):
    pipe = build_pipeline(version, image_to_video=image)
    assert in_training(pipe) == []


def test_plain_diffusers_given_the_pipeline_repeats_itself():
    """T5's dropout was on: two calls differed (by 1.5 here)."""
    pipe = build_pipeline()

    def latents():
        return pipe("a red fox", height=16, width=16, num_frames=9, num_inference_steps=2,
                    max_sequence_length=16, generator=torch.Generator().manual_seed(0),
                    output_type="latent").frames
    assert torch.equal(latents(), latents())
