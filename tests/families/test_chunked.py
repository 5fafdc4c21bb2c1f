"""Pipelines that make their video chunk by chunk, handed on as they finish each chunk
(the pipelines themselves run in tests/generate/test_streaming.py): what is wrapped
lives for the call only, and a final decode that cannot be answered from the chunks
decoded is the VAE's own."""

import contextlib
import types

import numpy as np
import pytest
import torch

from porter.families import chunked, wan_vae
from porter.families.base import Handover, as_uint8


class Processor:
    @staticmethod
    def postprocess_video(video, output_type):  # (batch, frames, height, width, channels)
        return (video.permute(0, 2, 3, 4, 1).numpy() + 1) / 2


def test_a_chunk_decoding_pipelines_decode_is_put_back_whatever_happens():
    """The wrapper that hands each decoded chunk on lives for the call only, also when
    the call fails halfway."""

    class HeliosPipeline:  # named as a pipeline that decodes chunk by chunk
        vae_scale_factor_temporal = 4
        video_processor = Processor()

    class VAE(torch.nn.Module):
        def decode(self, z, return_dict=False):
            return (z,)

    pipe, made = HeliosPipeline(), []
    pipe.vae = VAE()
    handover, watching = chunked.handed_on(pipe, made.append)
    with pytest.raises(RuntimeError, match="halfway"):
        with watching:
            pipe.vae.decode(torch.zeros(1, 3, 5, 2, 2))
            raise RuntimeError("halfway")
    assert "decode" not in vars(pipe.vae) and [len(c) for c in made] == [2]


class Frames:
    """Stands in for ``wan_vae.FrameByFrame``: each latent frame "decoded" as itself."""

    def __init__(self, vae):
        self.count = 0

    def __call__(self, z):
        for index in range(z.shape[2]):
            self.count += 1
            yield z[:, :, index:index + 1]


def _finished(monkeypatch):
    monkeypatch.setattr(wan_vae, "FrameByFrame", Frames)
    own = []

    class VAE:
        dtype, use_tiling = torch.float32, False
        config = types.SimpleNamespace(latents_mean=[0.0] * 3, latents_std=[0.5] * 3, z_dim=3)

        def decode(self, z, return_dict=True):
            own.append(z)
            return (z,)

    pipe, made = types.SimpleNamespace(vae=VAE(), video_processor=Processor()), []
    return chunked._Finished(pipe, Handover(made.append)), made, own


def test_finished_frames_go_on_and_answer_the_final_decode(monkeypatch):
    finished, made, own = _finished(monkeypatch)
    latents = torch.rand(1, 3, 5, 2, 2) * 0.1
    finished.finished(latents[:, :, :2])
    finished.finished(latents[:, :, :3])  # the first two again, and one more
    assert [len(c) for c in made] == [1, 1, 1]
    video = finished.answered(latents * 0.5, return_dict=False)[0]  # as the pipeline scales
    assert [len(c) for c in made] == [1, 1, 1, 1, 1] and own == []
    assert torch.equal(video, latents * 0.5)


def test_a_video_that_begins_with_its_input_hands_that_on_first(monkeypatch):
    """Diffusion forcing's video-to-video: the input video's frames go on at the first
    finishing call, before any chunk, once; then the chunks as they are finished."""
    finished, made, _ = _finished(monkeypatch)
    given = torch.rand(1, 3, 7, 2, 2) * 2 - 1  # the input video, preprocessed
    calls = []
    finished.pipe.prepare_latents = lambda video, video_latents=None: calls.append(video)
    latents = torch.rand(1, 3, 3, 2, 2)
    finishing = chunked.FINISHES_CHUNKS["SkyReelsV2DiffusionForcingVideoToVideoPipeline"]
    with finished.watching(finishing):
        finished.pipe.prepare_latents(given)  # the first window: nothing finished yet
        finished.pipe.prepare_latents(given, video_latents=latents[:, :, :2])
        finished.pipe.prepare_latents(given, video_latents=latents)
    assert [len(c) for c in made] == [7, 1, 1, 1] and len(calls) == 3
    assert np.array_equal(made[0], as_uint8(Processor.postprocess_video(given, "np")[0]))
    # the text-to-video form has no input to begin with
    assert chunked.FINISHES_CHUNKS["SkyReelsV2DiffusionForcingPipeline"].begins_with is None


def test_a_final_decode_of_other_latents_is_the_vaes_own(monkeypatch):
    """Final latents that do not begin with the frames decoded: the VAE's own decode,
    and a warning that the stream showed other frames."""
    from porter.runtime import notices

    finished, made, own = _finished(monkeypatch)
    latents = torch.rand(1, 3, 4, 2, 2)
    finished.finished(latents[:, :, :2])
    changed = latents * 0.5
    changed[:, :, 0] += 1
    assert finished.answered(changed, return_dict=False)[0] is changed
    assert len(own) == 1 and [len(c) for c in made] == [1, 1]
    assert any("final latents differ" in message for message in notices.given())


def test_without_a_taker_the_pipeline_is_left_alone():
    class SkyReelsV2DiffusionForcingPipeline:
        vae = None

    _, watching = chunked.handed_on(SkyReelsV2DiffusionForcingPipeline(), None)
    assert isinstance(watching, contextlib.nullcontext)


def test_a_pipeline_is_matched_by_the_classes_it_is_built_on():
    class AnyFlowFARPipeline:
        pass

    class Mine(AnyFlowFARPipeline):
        pass

    assert chunked._named(Mine, chunked.FINISHES_CHUNKS) == "AnyFlowFARPipeline"
    assert not chunked.decodes_chunks(Mine)
    assert np.array_equal(chunked._far_finished((), {
        "chunk_partition": [1, 2], "output": torch.arange(4).view(1, 4, 1, 1, 1)})
        .flatten(), torch.arange(3))


def test_a_batch_or_a_tiled_size_is_the_vaes_own(monkeypatch):
    """Latents the VAE would slice (a batch) or tile (a size over its tile): nothing is
    decoded here, the final decode is the VAE's own, also with no chunk finished
    before it (a short video)."""
    finished, made, own = _finished(monkeypatch)
    finished.finished(torch.rand(2, 3, 2, 2, 2))  # a batch of two
    assert made == [] and finished.off
    finished, made, own = _finished(monkeypatch)
    vae = finished.vae
    vae.use_tiling, vae.spatial_compression_ratio = True, 8
    vae.tile_sample_min_width = vae.tile_sample_min_height = 8  # a tile of 1 latent
    z = torch.rand(1, 3, 2, 2, 2)
    assert finished.answered(z, return_dict=False)[0] is z and len(own) == 1
    assert made == []
