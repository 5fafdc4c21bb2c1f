"""Helios's blocks modulated by their timestep embedding's two rows
(porter/families/helios_modulation.py): the model's values exactly, through Helios's
own pipeline with a history."""

import numpy as np
import pytest
import torch

from porter.families import helios_modulation
from porter.registry import builtin


def test_the_rows_select_what_the_model_adds_per_token():
    table = torch.randn(1, 6, 8)
    history, chunk = torch.randn(2, 1, 6, 8), torch.randn(2, 1, 6, 8)
    temb = torch.cat([history.expand(2, 5, 6, 8), chunk.expand(2, 3, 6, 8)], dim=1)
    models = (table.unsqueeze(0) + temb.float()).chunk(6, dim=2)
    ours = helios_modulation.segment_rows(table, helios_modulation.rows_of(temb), tokens=8,
                                          chunk_tokens=3)
    for theirs, mine in zip(models, ours):
        assert torch.equal(theirs.squeeze(2), mine)


def test_a_helios_video_with_a_history_is_the_models_exactly(monkeypatch):
    """Chunks of 2 latent frames, each denoised with the chunks before as its
    history (zero history timestep, guidance cross-attention: the tiny model's
    settings are Helios's): the patched blocks make the same video, bit for bit."""
    from models.helios import build_helios_pipeline

    pipe = build_helios_pipeline()
    calls = []
    rows = helios_modulation.segment_rows
    monkeypatch.setattr(helios_modulation, "segment_rows",
                        lambda *a: calls.append((a[2], a[3])) or rows(*a))

    def video():
        return pipe("a cat", height=16, width=16, num_frames=9, num_inference_steps=2,
                    guidance_scale=1.0, max_sequence_length=16, output_type="np",
                    num_latent_frames_per_chunk=2,
                    generator=torch.Generator().manual_seed(0)).frames[0]

    theirs = video()
    with builtin.HELIOS_TWO_ROW_MODULATION.applied():
        ours = video()
    assert calls, "the patched blocks were not called"
    tokens, chunk = calls[-1]
    assert tokens > chunk  # the tokens held a history beside the chunk
    assert np.array_equal(ours, theirs)


def test_a_block_given_one_row_for_every_token_runs_the_models_forward():
    """Without a per-token embedding (ndim 3, one row for the whole batch) the patch
    hands the block to the model's own forward."""
    from diffusers.models.transformers.transformer_helios import HeliosTransformerBlock

    torch.manual_seed(0)
    block = HeliosTransformerBlock(dim=24, ffn_dim=32, num_heads=2,
                                   qk_norm="rms_norm_across_heads", cross_attn_norm=True)
    x, text = torch.randn(1, 6, 24), torch.randn(1, 4, 24)
    temb = torch.randn(1, 6, 24)  # (batch, 6 modulations, width)
    rotary = torch.zeros(1, 6, 24)
    with torch.no_grad():
        theirs = block(x, text, temb, rotary, 6)
        with builtin.HELIOS_TWO_ROW_MODULATION.applied():
            ours = block(x, text, temb, rotary, 6)
    assert torch.equal(ours, theirs)


@pytest.mark.slow
def test_a_port_takes_the_rows_once_before_its_scan_of_the_blocks(tmp_path, monkeypatch):
    """Through a port (the blocks as one scan): the rows taken from the per-token
    embedding once, before the loop (``scan_inputs``), not by each block; the video the
    unpatched port makes, within a level."""
    import sys

    import porter
    from models.helios import build_helios_pipeline

    build_helios_pipeline().save_pretrained(tmp_path / "helios")
    (tmp_path / "r.yaml").write_text(
        f"model: {{family: generic, source: {tmp_path / 'helios'}, pipeline: HeliosPipeline}}\n"
        "generate: {prompt: a cat, height: 16, width: 16, frames: 9, steps: 2,\n"
        "           guidance_scale: 1.0, max_sequence_length: 16,\n"
        "           extra: {num_latent_frames_per_chunk: 2}}\n"
        "compile: {transformer: {scan: true}}\n")
    takers = []
    rows = helios_modulation.rows_of
    monkeypatch.setattr(helios_modulation, "rows_of",
                        lambda temb: takers.append(sys._getframe(1).f_code.co_name)
                        or rows(temb))
    videos = []
    for patches in ("[]", "[core.helios_two_row_modulation]"):
        with porter.load(tmp_path / "r.yaml", f"patches={patches}") as port:
            videos.append(port.generate().frames.astype(int))
    assert takers and set(takers) == {"scan_inputs"}
    assert np.abs(videos[0] - videos[1]).max() <= 1
