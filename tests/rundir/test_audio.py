"""A pipeline's sound in the run directory: losslessly in audio.wav (float32, equal to
the waveform), and in the mp4 as AAC beside the frames (a lossy codec: within a
stated signal-to-noise ratio, the same bytes for the same sound)."""

import types

import numpy as np
import pytest
import torch

from porter.rundir import audio, outputs, results, video

#: the least signal-to-noise ratio (dB) of the mp4's sound against the waveform: ffmpeg's
#: AAC encoder at its default rate (about 94 kbit/s for 16 kHz stereo) keeps 28 dB of a
#: tone pair and 22 dB of the tiny LTX-2's noise-like waveform (tests/matrix)
AAC_SNR_DB = 20.0


def tones(seconds=1.0, rate=16000) -> audio.Audio:
    t = np.arange(int(seconds * rate)) / rate
    return audio.Audio(np.stack([0.8 * np.sin(2 * np.pi * 440 * t),
                                 0.4 * np.sin(2 * np.pi * 220 * t)]).astype(np.float32),
                       rate)


def snr_db(reference: np.ndarray, decoded: np.ndarray) -> float:
    n = reference.shape[1]
    error = decoded[:, :n] - reference
    return float(10 * np.log10((reference ** 2).sum() / (error ** 2).sum()))


def test_the_wav_is_the_waveform(tmp_path):
    sound = tones()
    audio.write_wav(tmp_path / "a.wav", sound)
    back = audio.read(tmp_path / "a.wav")
    assert back.rate == 16000 and np.array_equal(back.samples, sound.samples)


def test_the_mp4_carries_the_sound_aligned_with_the_frames(tmp_path):
    sound = tones()
    frames = np.random.default_rng(0).integers(0, 256, (16, 32, 32, 3), dtype=np.uint8)
    digest = video.write_mp4(tmp_path / "v.mp4", frames, 16, sound)
    assert digest == video.write_mp4(tmp_path / "again.mp4", frames, 16, sound)
    decoded = audio.read(tmp_path / "v.mp4")
    assert decoded.rate == 16000 and decoded.samples.shape[0] == 2
    assert snr_db(sound.samples, decoded.samples) >= AAC_SNR_DB  # and from sample 0 on
    import av
    with av.open(str(tmp_path / "v.mp4")) as container:
        streams = {s.type: s for s in container.streams}
        assert streams["video"].start_time == streams["audio"].start_time == 0
        assert float(streams["video"].duration * streams["video"].time_base) == 1.0
        assert float(streams["audio"].duration * streams["audio"].time_base) == 1.0
    read, fps = video.read_mp4(tmp_path / "v.mp4")
    assert read.shape == frames.shape and fps == 16


def test_a_rate_aac_cannot_carry_is_resampled_for_the_mp4(tmp_path):
    """A tiny MiniMax-H3 makes its sound at 160 Hz: the mp4 carries it at 48 kHz, as
    long; the lossless file keeps 160 Hz."""
    t = np.arange(800) / 160
    sound = audio.Audio(np.stack([0.5 * np.sin(2 * np.pi * 5 * t)] * 2).astype(np.float32),
                        160)
    frames = np.zeros((120, 32, 32, 3), dtype=np.uint8)
    video.write_mp4(tmp_path / "v.mp4", frames, 24, sound)
    decoded = audio.read(tmp_path / "v.mp4")
    assert decoded.rate == 48000 and abs(decoded.samples.shape[1] / 48000 - 5.0) < 0.05
    expected = audio.for_aac(sound)
    assert expected.rate == 48000 and snr_db(expected.samples, decoded.samples) >= AAC_SNR_DB
    # the tiny Kandinsky 6 TI2VA's sound: 16 samples at 64 Hz, a quarter of a second
    short = audio.for_aac(audio.Audio(np.full((1, 16), 0.5, dtype=np.float32), 64))
    assert short.samples.shape == (1, 12000) and abs(short.samples[0, 6000] - 0.5) < 0.01
    fast = audio.for_aac(audio.Audio(np.full((2, 10), 0.5, dtype=np.float32), 192000))
    assert fast.samples.shape == (2, 2) and fast.rate == 48000


@pytest.mark.parametrize("shape,channels", [((100,), 1), ((2, 100), 2), ((1, 2, 100), 2),
                                            ((1, 100), 1), ((100, 2), 2)])
def test_waveforms_of_every_shape(shape, channels):
    made = audio.of(torch.full(shape, 2.0, dtype=torch.bfloat16), 24000)
    assert made.samples.shape == (channels, 100) and made.samples.max() == 1.0


@pytest.mark.parametrize("waveform,reason", [
    (np.zeros((1, 6, 100)), "one or two channels"), (np.zeros((2, 0)), "one or two"),
    (np.array([[0.0, np.nan, 0.5]]), "not finite")])
def test_a_waveform_porter_cannot_write_is_said_so(waveform, reason):
    with pytest.raises(audio.Unusable, match=reason):
        audio.of(waveform, 24000)


def test_a_run_keeps_its_frames_when_its_sound_cannot_be_written(write):
    """The sound is dropped with a warning (no rate said, NaN, six channels, or
    output.audio: false), never the video."""
    import types

    from porter import recipe
    from porter.generate.runners import _sound
    from porter.runtime import notices

    loaded = recipe.load(write("r.yaml", "model: {family: wan, source: tiny}\n"
                               "generate: {prompt: a cat}\n"))
    pipe = types.SimpleNamespace(audio_sample_rate=16000)
    assert _sound(pipe, loaded, np.zeros((2, 10)), None).rate == 16000
    said = len(notices.given())
    assert _sound(types.SimpleNamespace(), loaded, np.zeros((2, 10)), None) is None
    assert _sound(pipe, loaded, np.full((2, 10), np.nan), None) is None
    assert _sound(pipe, loaded, np.zeros((6, 10)), None) is None
    warned = notices.given()[said:]
    assert len(warned) == 3 and "sample rate" in warned[0] and "not finite" in warned[1]
    silent = recipe.load(write("s.yaml", "model: {family: wan, source: tiny}\n"
                               "generate: {prompt: a cat}\n"), ["output.audio=false"])
    assert _sound(pipe, silent, np.zeros((2, 10)), None) is None


def test_the_rate_comes_from_the_output_then_the_components():
    config = types.SimpleNamespace
    vocoder = config(config=config(output_sampling_rate=24000))
    audio_vae = config(config=config(sample_rate=44100))
    assert audio.sample_rate(config(vocoder=vocoder), np.array([48000])) == 48000
    assert audio.sample_rate(config(vocoder=vocoder, audio_vae=audio_vae)) == 24000
    assert audio.sample_rate(config(audio_sample_rate=44100)) == 44100
    assert audio.sample_rate(config(audio_vae=audio_vae)) == 44100
    assert audio.sample_rate(config()) is None


def test_results_write_and_describe_the_sound(tmp_path, write):
    from porter import recipe

    loaded = recipe.load(write("r.yaml", "model: {family: wan, source: tiny}\n"
                               "generate: {prompt: a cat}\n"), ["output.wav=true"])
    frames = np.zeros((16, 32, 32, 3), dtype=np.uint8)
    written = results.write_results(tmp_path, loaded, frames, None, tones())
    assert written["audio"] == {"sample_rate": 16000, "channels": 2, "samples": 16000,
                                "seconds": 1.0, "in_video": True, "codec": "aac",
                                "video_rate": 16000, "wav": "audio.wav"}
    assert set(written["files"]) == {"video.mp4", "audio.wav"}
    results.invalidate(tmp_path, (), keep_progress=False)  # another run's sound goes too
    assert not (tmp_path / outputs.WAV).exists()
    silent = results.write_results(tmp_path, loaded, frames, None, None)
    assert silent["audio"] is None and set(silent["files"]) == {"video.mp4"}
