"""Wan 2.2 two-expert layout: the switch happens at the same step as in diffusers."""

import pytest
import torch

from porter import registry as registry_mod, recipe
from porter.commands.run import run

pytestmark = pytest.mark.slow

TWO_EXPERTS = """\
model: {family: wan, source: tiny, variant: t2v-two-experts}
generate: {prompt: "a cat", height: 32, width: 32, frames: 9, steps: 6,
           max_sequence_length: 16, guidance_scale: 5.0, guidance_scale_2: 3.0}
rotary: {precompute: true}
dtypes: {overrides: {transformer: [{match: 'rope\\..*', dtype: float32}],
                     transformer_2: transformer}}
"""


def diffusers_run(gen):
    """Latents and, per step, which expert ran (1: high noise, 2: low noise)."""
    from porter_wan.tiny import build_pipeline

    pipe = build_pipeline(experts=2)
    calls = []
    for index, model in ((1, pipe.transformer), (2, pipe.transformer_2)):
        model.eval().register_forward_hook(lambda *_, index=index: calls.append(index))
    pipe.vae.eval(), pipe.text_encoder.eval()
    latents = pipe(gen.prompt, negative_prompt=gen.negative_prompt, height=gen.height,
                   width=gen.width, num_frames=gen.frames, num_inference_steps=gen.steps,
                   guidance_scale=gen.guidance_scale, guidance_scale_2=gen.guidance_scale_2,
                   max_sequence_length=gen.max_sequence_length,
                   generator=torch.Generator().manual_seed(gen.seed),
                   output_type="latent").frames
    return latents, calls[::2]  # two guidance passes per step


def test_switch_step_and_latents_match_diffusers(write, tmp_path, monkeypatch):
    from porter_wan.family import WanFamily

    loaded = recipe.load(write("two.yaml", TWO_EXPERTS), [f"output.dir={tmp_path}"])
    chosen = []
    original = WanFamily.denoiser

    def spy(self, pipe, timestep, sampling, recipe):
        model, scale = original(self, pipe, timestep, sampling, recipe)
        chosen.append(1 if model is pipe.transformer else 2)
        return model, scale
    monkeypatch.setattr(WanFamily, "denoiser", spy)
    result = run(loaded, registry_mod.loaded(), progress=False)
    expected, expected_experts = diffusers_run(loaded.generate)
    assert chosen == expected_experts
    assert 1 in chosen and 2 in chosen  # the boundary falls inside this schedule
    assert (result.latents - expected).abs().max() <= 1e-4
