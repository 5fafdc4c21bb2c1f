"""AnyFlow FAR at fixed shapes (porter/families/far.py): the pipeline's video as the
model's own calls make it, and programs that do not grow with the video."""

import numpy as np
import pytest
import torch
from models.anyflow_far import build_anyflow_far_pipeline

from porter.families import far
from porter.registry import builtin

# (chunks, frames): one latent frame a chunk; chunks of several frames, the first
# leaving the window before the last; the released checkpoints' own layout
LAYOUTS = (([1, 1, 1, 1, 1], 17), ([1, 2, 2, 1, 2], 29), ([1, 3, 3, 3, 3, 3, 3, 2], 81))


@pytest.fixture(scope="module")
def pipe():
    return build_anyflow_far_pipeline()


def _latents(pipe, chunks, frames, size):
    return pipe("a cat", height=size, width=size, num_frames=frames, num_inference_steps=2,
                guidance_scale=6.0, max_sequence_length=16, chunk_partition=chunks,
                generator=torch.Generator().manual_seed(0), output_type="latent").frames


@pytest.mark.parametrize("chunks, frames", LAYOUTS)
def test_fixed_size_calls_make_the_models_own_latents(pipe, chunks, frames):
    """In plain PyTorch, the patched call's latents are the model's own within float32
    rounding: at 32x32 (one compressed token a frame) and 48x48 (four, and 36 full)."""
    for size in (32, 48):
        own = _latents(pipe, chunks, frames, size)
        with builtin.FAR_FIXED_SIZE.applied():
            fixed = _latents(pipe, chunks, frames, size)
        assert (fixed - own).abs().max() <= 1e-5 * own.abs().max(), (chunks, size)
    assert "transformer" in vars(pipe) and not isinstance(pipe.transformer, far.FixedSize)


def test_the_layout_covers_the_longer_of_the_call_and_the_models_own(pipe):
    config = pipe.transformer.config  # its own layout: 1, 3 x 6, 2 (13 compressed frames)
    assert far.layout(config, [1, 1, 1], 4, 4) == far.Layout(
        full=4, compressed=1, keep=2, longest=3, context=13, grid=(4, 4))
    assert far.layout(config, [1] + [3] * 10, 6, 6).context == 22  # 1 + 3 x 7
    assert far.context_frames([1, 2], 3) == 0


@pytest.mark.slow
def test_a_run_compiles_the_same_programs_for_any_length(tmp_path):
    """Through Porter, 1, 2, 4 and 8 chunks of one latent frame: 8 chunks compile
    nothing 4 did not (denoising calls before and after the first cache call, and
    three kinds of cache call: the first chunk's, two in the window, one leaving it),
    fewer chunks call the kinds they reach; the 8-chunk video is plain diffusers'
    within a level. (One chunk runs here; in diffusers itself its cache for a video
    shorter than the window has a negative size.)"""
    from porter.aot import programs
    from porter.transforms import jit

    pipe = build_anyflow_far_pipeline()
    expected = pipe("a cat", height=32, width=32, num_frames=29, num_inference_steps=2,
                    guidance_scale=6.0, max_sequence_length=16, chunk_partition=[1] * 8,
                    generator=torch.Generator().manual_seed(0), output_type="np").frames[0]
    pipe.save_pretrained(tmp_path / "far")
    (tmp_path / "r.yaml").write_text(
        f"model: {{family: generic, source: {tmp_path / 'far'}}}\n"
        "generate: {prompt: a cat, height: 32, width: 32, frames: 5, steps: 2,\n"
        "           guidance_scale: 6.0, max_sequence_length: 16}\n")
    import porter

    found, videos = {}, {}
    with porter.load(tmp_path / "r.yaml") as loaded:
        rules = jit.rules(loaded.recipe, loaded.family, "cpu")
        for chunks in (1, 2, 4, 8):
            frames = 4 * (chunks - 1) + 1
            with programs.recorded(loaded.pipe, rules) as calls:
                videos[chunks] = loaded.generate(
                    frames=frames, extra={"chunk_partition": [1] * chunks}).frames
            found[chunks] = {(c.method, repr(c.args), repr(c.kwargs)) for c in calls
                             if c.component == "transformer"}
    assert {method for method, _, _ in found[8]} == {"far_step", "far_cache"}
    assert len(found[8]) == 5
    assert found[1] <= found[2] <= found[4] == found[8], "a longer video compiled more"
    assert np.abs((expected * 255).round() - videos[8]).max() <= 1
