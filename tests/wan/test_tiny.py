"""The tiny Wan pipelines come in eval mode, as ``from_pretrained`` gives a pipeline:
plain diffusers given one is deterministic, so it can be a reference."""

import pytest
import torch

from support import in_training

from porter_wan.tiny import VARIANTS, build


def plain_latents(pipe):
    return pipe("a red fox", height=32, width=32, num_frames=5, num_inference_steps=2,
                max_sequence_length=16, generator=torch.Generator().manual_seed(0),
                output_type="latent").frames


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_module_is_in_eval_mode(variant):
    pipe = build(variant)
    assert in_training(pipe) == []


def test_plain_diffusers_given_the_pipeline_repeats_itself():
    """UMT5's dropout was on: two calls differed (by 0.58 here)."""
    pipe = build()
    assert torch.equal(plain_latents(pipe), plain_latents(pipe))
