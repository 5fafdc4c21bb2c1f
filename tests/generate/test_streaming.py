"""Frames as they are made: Wan's decode latent frame by latent frame (equal to the
whole decode, its programs not growing with the video), stream.mp4 (a fragmented MP4
a player reads while it grows) and what the run record says about it."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import porter
from porter import recipe as recipe_mod
from porter.rundir.video import Stream, read_mp4

ROOT = Path(__file__).resolve().parents[2]

RECIPE = """\
model: {family: wan, source: tiny, dtype: float32}
generate: {prompt: "a red fox", height: 64, width: 64, frames: 17, steps: 2,
           max_sequence_length: 16, seed: 3}
output: {fps: 8, dir: %s}
patches: [wan.vae_decode_scan]
"""


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stream")
    (folder / "r.yaml").write_text(RECIPE % (folder / "out"))
    with porter.load(folder / "r.yaml") as loaded:
        yield loaded


def _programs() -> int:
    """Programs JAX has lowered in this process so far."""
    from porter.runtime.monitor import compile_monitor

    return compile_monitor().programs


def _chunks(port, latents):
    with port.active(), port.runtime.env:
        return list(port.family.decode_chunks(port.pipe, latents, port.recipe))


def test_chunks_equal_the_whole_decode_and_programs_do_not_grow(port):
    torch.manual_seed(0)
    short, long = torch.randn(1, 16, 5, 8, 8), torch.randn(1, 16, 9, 8, 8)
    before = _programs()
    chunks = _chunks(port, short)
    first = _programs() - before
    assert [len(c) for c in chunks] == [1, 4, 4, 4, 4]  # the first frame, then four
    with port.active(), port.runtime.env:
        whole = port.family.decode(port.pipe, short, port.recipe)
    assert np.array_equal(np.concatenate(chunks), whole)  # the same frames, exactly
    before = _programs()
    longer = _chunks(port, long)
    assert len(longer) == 9 and sum(len(c) for c in longer) == 33
    assert _programs() == before, "a longer video compiled new programs"
    assert first >= 2  # the first latent frame's program, and the later ones'


def test_cogvideox_streams_two_latent_frames_at_a_time(tmp_path):
    """The other causal VAE: CogVideoX's batches of latent frames, each with its cache,
    equal to its whole decode; a longer video compiles nothing new."""
    with porter.load(ROOT / "recipes" / "cogvideox-tiny.yaml",
                     "generate.frames=25") as cog:
        made = []
        generation = cog.generate(on_frames=made.append)
        assert [len(c) for c in made] == [9, 8, 8]  # 3, 2 and 2 latent frames
        latents = generation.latents
        with cog.active(), cog.runtime.env:
            assert np.array_equal(generation.frames, cog.family.decode(
                cog.pipe, latents, cog.recipe))
        torch.manual_seed(0)
        longer = torch.randn(1, 11, *latents.shape[2:])  # 11 latent frames: 41 frames
        before = _programs()
        chunks = _chunks(cog, longer)
        assert _programs() == before, "a longer video compiled new programs"
        with cog.active(), cog.runtime.env:
            whole = cog.family.decode(cog.pipe, longer,
                                      recipe_mod.with_values(cog.recipe, "generate",
                                                             {"frames": 41}, "test"))
        assert np.array_equal(np.concatenate(chunks), whole)


def test_a_run_streams_its_frames_into_stream_mp4(port):
    from porter.generate import runners
    from porter.generate.call import Call

    made, directory = [], Path(port.recipe.output.dir)

    call = Call(port.recipe, directory=directory, on_frames=made.append)
    directory.mkdir(parents=True, exist_ok=True)
    outcome = port.run(call)
    written = runners.finish(port, port.recipe, outcome, directory)
    assert [len(c) for c in made] == [1, 4, 4, 4, 4]
    assert np.array_equal(np.concatenate(made), written.frames)
    stream = directory / "stream.mp4"
    data = stream.read_bytes()
    assert data.count(b"moof") == 17  # a fragment a frame, behind one header
    shown, fps = read_mp4(stream)
    kept, _ = read_mp4(written.video)
    assert shown.shape == kept.shape == (17, 64, 64, 3) and fps == 8
    # two lossy encodings of the same frames
    assert np.abs(shown.astype(int) - kept).mean() < 3
    record = json.loads(written.record.read_text())
    timings = record["timings"]["stream"]
    assert timings["file"] == "stream.mp4" and timings["chunks"] == 5
    assert 0 < timings["first_chunk_s"] <= timings["first_playable_s"]
    assert record["outputs"]["files"]["stream.mp4"]


def test_the_api_hands_over_each_chunk(port):
    made = []
    generation = port.generate(on_frames=made.append)
    assert [len(c) for c in made] == [1, 4, 4, 4, 4]
    assert np.array_equal(np.concatenate(made), generation.frames)
    assert generation.record["timings"]["stream"]["file"] is None  # no run directory


def test_stream_is_playable_before_it_is_finished(tmp_path):
    import av

    frames = np.random.default_rng(0).integers(0, 255, (9, 32, 48, 3), dtype=np.uint8)
    stream = Stream(tmp_path / "s.mp4", fps=8)
    stream.add(frames[:1])
    assert not stream.playable  # the muxer closes a fragment when the next frame comes
    stream.add(frames[1:5])
    assert stream.playable
    with av.open(str(tmp_path / "s.mp4")) as partial:  # read while it grows
        assert len(list(partial.decode(video=0))) == 4
    stream.add(frames[5:])
    stream.close()
    stream.close()  # twice is harmless
    shown, _ = read_mp4(tmp_path / "s.mp4")
    assert shown.shape == frames.shape


def test_output_stream_false_writes_none(port, tmp_path):
    from porter.generate.call import Call

    off = recipe_mod.with_values(port.recipe, "output", {"stream": False}, "test")
    call = Call(off, directory=tmp_path)
    port.run(call)
    assert not (tmp_path / "stream.mp4").exists()
    assert call.timings["stream"]["file"] is None and call.timings["stream"]["chunks"] == 5


def test_a_stream_that_cannot_be_written_does_not_stop_the_run(port, tmp_path, monkeypatch):
    from porter.generate.call import Call
    from porter.runtime import notices

    def full(self, frames):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(Stream, "add", full)
    call = Call(port.recipe, directory=tmp_path)
    warned = len(notices.given())
    outcome = port.run(call)
    assert outcome.frames.shape == (17, 64, 64, 3)
    assert not (tmp_path / "stream.mp4").exists()
    assert call.timings["stream"]["file"] is None and call.timings["stream"]["chunks"] == 5
    assert any("stream.mp4 is not written: OSError" in str(w)
               for w in notices.given()[warned:])


HELIOS = """\
model: {family: generic, source: %s, pipeline: HeliosPipeline}
generate: {prompt: "a cat", height: 16, width: 16, frames: 5, steps: 2,
           guidance_scale: 1.0, max_sequence_length: 16,
           extra: {num_latent_frames_per_chunk: 2}}
output: {fps: 8, dir: %s}
"""


@pytest.mark.slow
def test_helios_hands_over_each_chunk_as_it_decodes_it(tmp_path):
    """An autoregressive pipeline's chunks (Helios: 2 latent frames, 5 frames a chunk,
    each decoded as it is made) go on as they come; its video is diffusers' own; its
    compiled programs are the same for 1, 2 and 4 chunks."""
    from diffusers import HeliosPipeline

    from models.helios import build_helios_pipeline
    from porter.aot import programs
    from porter.generate import runners
    from porter.generate.call import Call
    from porter.transforms import jit

    build_helios_pipeline().save_pretrained(tmp_path / "helios")
    (tmp_path / "r.yaml").write_text(HELIOS % (tmp_path / "helios", tmp_path / "out"))
    signatures = {}
    with porter.load(tmp_path / "r.yaml") as helios:
        rules = jit.rules(helios.recipe, helios.family, "cpu")
        for frames, sizes in ((5, [2, 3]), (10, [2, 5, 2]), (20, [2, 5, 5, 5])):
            made = []
            with programs.recorded(helios.pipe, rules) as calls:
                generation = helios.generate(frames=frames, on_frames=made.append)
            # each chunk less the 3 frames the end's trim to 4n+1 may take, then the rest
            assert [len(c) for c in made] == sizes, frames
            assert np.array_equal(np.concatenate(made), generation.frames)
            signatures[frames] = {(c.component, c.method, repr(c.args), repr(c.kwargs))
                                  for c in calls}
            assert generation.record["timings"]["stream"]["chunks"] == len(sizes)
        assert getattr(helios.pipe.vae.decode, "__name__", "") != "handed_on"  # put back
        # the text encoder's (once: later calls find the prompt's encoding in memory),
        # the transformer's step, the VAE's chunk
        assert len(signatures[5]) == 3
        assert signatures[10] == signatures[20] == \
            {s for s in signatures[5] if s[0] != "text_encoder"}, \
            "a longer video compiled new programs"
        expected = HeliosPipeline.from_pretrained(tmp_path / "helios")(
            "a cat", height=16, width=16, num_frames=10, num_inference_steps=2,
            guidance_scale=1.0, max_sequence_length=16, num_latent_frames_per_chunk=2,
            generator=torch.Generator().manual_seed(0), output_type="np").frames[0]
        ten = helios.generate(frames=10).frames
        assert np.abs((expected * 255).round() - ten).max() <= 1
        # a run's stream.mp4 holds the chunks as they came
        directory = tmp_path / "run"
        directory.mkdir()
        outcome = helios.run(Call(helios.recipe, directory=directory))
        written = runners.finish(helios, helios.recipe, outcome, directory)
        shown, _ = read_mp4(directory / "stream.mp4")
        assert len(shown) == len(written.frames) == 5


@pytest.mark.slow
def test_helios_pyramid_hands_over_each_chunk_too(tmp_path):
    """The pyramid form (each chunk denoised from a coarse size up) decodes the same
    way: its chunks go on as they come and make diffusers' own video."""
    from diffusers import HeliosPyramidPipeline

    from models.helios_pyramid import build_helios_pyramid_pipeline

    build_helios_pyramid_pipeline().save_pretrained(tmp_path / "pyramid")
    (tmp_path / "r.yaml").write_text(
        f"model: {{family: generic, source: {tmp_path / 'pyramid'}, "
        "pipeline: HeliosPyramidPipeline}\n"
        "generate: {prompt: a cat, height: 64, width: 64, frames: 10, guidance_scale: 1.0,\n"
        "           max_sequence_length: 16, extra: {num_latent_frames_per_chunk: 2,\n"
        "           pyramid_num_inference_steps_list: [1, 1, 1]}}\n")
    made = []
    with porter.load(tmp_path / "r.yaml") as pyramid:
        generation = pyramid.generate(on_frames=made.append)
    assert [len(c) for c in made] == [2, 5, 2]
    assert np.array_equal(np.concatenate(made), generation.frames)
    expected = HeliosPyramidPipeline.from_pretrained(tmp_path / "pyramid")(
        "a cat", height=64, width=64, num_frames=10, guidance_scale=1.0,
        max_sequence_length=16, num_latent_frames_per_chunk=2,
        pyramid_num_inference_steps_list=[1, 1, 1],
        generator=torch.Generator().manual_seed(0), output_type="np").frames[0]
    assert np.abs((expected * 255).round() - generation.frames).max() <= 1


SKYREELS_DF = """\
model: {family: generic, source: %s, pipeline: SkyReelsV2DiffusionForcingPipeline}
generate: {prompt: "a cat", height: 16, width: 16, frames: 17, steps: 2,
           guidance_scale: 6.0, max_sequence_length: 16,
           extra: {base_num_frames: 9, overlap_history: 5}}
"""


@pytest.mark.slow
def test_skyreels_diffusion_forcing_hands_over_each_window_as_it_is_finished(tmp_path):
    """A pipeline that decodes its video whole at its end (SkyReels-V2 diffusion forcing,
    a long video in windows of 3 latent frames overlapping by 2): each window's
    finished latent frames are decoded when the next window starts, the rest at its
    end, once each; its video is the whole decode's and diffusers' own; a longer video
    compiles nothing new."""
    from diffusers import SkyReelsV2DiffusionForcingPipeline

    from models.skyreels_v2_df import build_skyreels_v2_df_pipeline
    from porter.aot import programs
    from porter.transforms import jit

    build_skyreels_v2_df_pipeline().save_pretrained(tmp_path / "df")
    (tmp_path / "r.yaml").write_text(SKYREELS_DF % (tmp_path / "df"))
    signatures = {}
    with porter.load(tmp_path / "r.yaml") as df:
        rules = jit.rules(df.recipe, df.family, "cpu")
        streamed = {}
        for frames, sizes in ((17, [1, 4, 4, 4, 4]), (25, [1, 4, 4, 4, 4, 4, 4])):
            made, looping = [], []

            def taken(chunk):  # the pipeline's loop is still running (its own flag)
                made.append(chunk)
                looping.append(df.pipe._current_timestep is not None)

            with programs.recorded(df.pipe, rules) as calls:
                streamed[frames] = df.generate(frames=frames, on_frames=taken).frames
            assert [len(c) for c in made] == sizes, frames
            # all but the last window's frames went on before the pipeline's own decode
            assert looping == [True] * (len(sizes) - 1) + [False]
            assert np.array_equal(np.concatenate(made), streamed[frames])
            signatures[frames] = {(c.component, c.method, repr(c.args), repr(c.kwargs))
                                  for c in calls}
        # the same, less the text encoder's (the second call finds the prompt's
        # encoding in memory)
        assert signatures[25] == {s for s in signatures[17] if s[0] != "text_encoder"}, \
            "a longer video compiled new programs"
        assert "prepare_latents" not in vars(df.pipe) and "decode" not in vars(df.pipe.vae)
        # no one takes the frames: the pipeline decodes its video whole, as written
        assert np.array_equal(df.generate().frames, streamed[17])
    expected = SkyReelsV2DiffusionForcingPipeline.from_pretrained(tmp_path / "df")(
        "a cat", height=16, width=16, num_frames=17, num_inference_steps=2,
        guidance_scale=6.0, max_sequence_length=16, base_num_frames=9, overlap_history=5,
        generator=torch.Generator().manual_seed(0), output_type="np").frames[0]
    assert np.abs((expected * 255).round() - streamed[17]).max() <= 1


@pytest.mark.slow
def test_skyreels_video_to_video_hands_over_its_input_then_each_window(tmp_path):
    """Diffusion forcing's video-to-video (the input video, then 17 new frames): the
    input's frames go on first, each finished window's as the next starts; together
    they are the video the pipeline makes without a taker."""
    from PIL import Image

    from models.skyreels_v2_df_v2v import build_skyreels_v2_df_v2v_pipeline

    build_skyreels_v2_df_v2v_pipeline().save_pretrained(tmp_path / "v2v")
    frames = np.random.default_rng(0).integers(0, 256, (7, 16, 16, 3), dtype=np.uint8)
    (tmp_path / "video").mkdir()
    for index, frame in enumerate(frames):
        Image.fromarray(frame).save(tmp_path / "video" / f"{index:05d}.png")
    (tmp_path / "r.yaml").write_text(
        f"model: {{family: generic, source: {tmp_path / 'v2v'},\n"
        "        pipeline: SkyReelsV2DiffusionForcingVideoToVideoPipeline}\n"
        f"generate: {{prompt: a cat, height: 16, width: 16, frames: 17, steps: 2,\n"
        f"           guidance_scale: 6.0, max_sequence_length: 16, video: {tmp_path / 'video'},\n"
        "           extra: {base_num_frames: 5, overlap_history: 3}}\n")
    with porter.load(tmp_path / "r.yaml") as v2v:
        made, looping = [], []

        def taken(chunk):
            made.append(chunk)
            looping.append(v2v.pipe._current_timestep is not None)

        streamed = v2v.generate(on_frames=taken).frames
        assert len(made[0]) == 7 and len(streamed) == 7 + 17 and len(made) > 2
        # the input before the first window's steps; the windows but the last while
        # the pipeline's loop ran
        assert looping[0] is False and looping[1:-1] == [True] * (len(made) - 2)
        assert np.array_equal(np.concatenate(made), streamed)
        assert np.array_equal(v2v.generate().frames, streamed)


@pytest.mark.slow
def test_anyflow_far_hands_over_each_chunk_as_it_is_finished(tmp_path):
    """AnyFlow FAR (frame-autoregressive, chunks of one latent frame) finishes a chunk
    where it caches the chunk's keys and values for the next: its frames go on there,
    and its video is the one its own whole decode makes (``tests/matrix``: diffusers')."""
    from models.anyflow_far import build_anyflow_far_pipeline

    build_anyflow_far_pipeline().save_pretrained(tmp_path / "far")
    (tmp_path / "r.yaml").write_text(
        f"model: {{family: generic, source: {tmp_path / 'far'}, pipeline: AnyFlowFARPipeline}}\n"
        "generate: {prompt: a cat, height: 16, width: 16, frames: 9, steps: 2,\n"
        "           guidance_scale: 6.0, max_sequence_length: 16,\n"
        "           extra: {chunk_partition: [1, 1, 1]}}\n")
    with porter.load(tmp_path / "r.yaml") as far:
        made = []
        streamed = far.generate(on_frames=made.append).frames
        assert [len(c) for c in made] == [1, 4, 4]
        assert np.array_equal(np.concatenate(made), streamed)
        assert np.array_equal(far.generate().frames, streamed)
