"""The sound a pipeline makes with its video: one waveform at its sample rate, written
into the mp4 beside the frames (AAC, ``video.encode_mp4``) and, on request, losslessly
(``audio.wav``, 32-bit float) with PyAV, the library that writes the video."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from porter.runtime import atomic
from porter.shims.interop import to_host

#: the channel layouts an mp4's AAC stream is written with, by channel count
LAYOUTS = {1: "mono", 2: "stereo"}
#: the sample rates AAC carries (its sampling-frequency table); a waveform at another
#: rate goes into the mp4 resampled to ``AAC_RATE`` (the lossless file keeps its own)
AAC_RATES = (7350, 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000,
             88200, 96000)
AAC_RATE = 48000
#: silent samples after a waveform being resampled (``for_aac``): more than the
#: resampler's filter holds back (16 at a 64 Hz input)
RESAMPLER_TAIL = 64


@dataclass(frozen=True)
class Audio:
    """A waveform: float32 samples (channels, count) in [-1, 1], and its rate in Hz."""
    samples: np.ndarray
    rate: int

    @property
    def seconds(self) -> float:
        return self.samples.shape[1] / self.rate

    def describe(self) -> dict:
        """What run.json says of it."""
        return {"sample_rate": self.rate, "channels": int(self.samples.shape[0]),
                "samples": int(self.samples.shape[1]), "seconds": round(self.seconds, 4)}


class Unusable(ValueError):
    """A waveform Porter cannot write (its shape, or values that are not finite)."""


def of(waveform, rate) -> Audio:
    """A pipeline's waveform (torch, torchax or numpy; (samples,), (channels, samples),
    (samples, channels), or a batch of either, of which the first is kept) as
    ``Audio``. ``Unusable`` for more than two channels, no samples, or values that are
    not finite."""
    if isinstance(waveform, torch.Tensor):  # torchax's too: its values, on this host
        waveform = to_host(waveform).float().numpy()
    samples = np.asarray(waveform, dtype=np.float32)
    if samples.ndim == 3:  # (batch, channels, samples)
        samples = samples[0]
    if samples.ndim == 1:
        samples = samples[None]
    if samples.ndim == 2 and samples.shape[0] not in LAYOUTS \
            and samples.shape[1] in LAYOUTS:  # (samples, channels)
        samples = samples.T
    if samples.ndim != 2 or samples.shape[0] not in LAYOUTS or samples.shape[1] == 0:
        raise Unusable(f"a waveform of shape {tuple(np.shape(waveform))}: Porter writes "
                       "one or two channels of samples")
    if not np.isfinite(samples).all():
        raise Unusable("the waveform holds values that are not finite (NaN or infinity)")
    return Audio(np.clip(samples, -1.0, 1.0), int(rate))


def aac_rate(rate: int) -> int:
    """The rate the mp4's AAC stream carries a waveform of ``rate`` at."""
    return rate if rate in AAC_RATES else AAC_RATE


def sample_rate(pipe, given=None) -> int | None:
    """The rate of a pipeline's waveform: what its output says (``sampling_rate``), else
    what its components say (the vocoder's output rate, the pipeline's or its audio
    VAE's sample rate); None when nothing says."""
    if given is not None:
        return int(np.asarray(given).reshape(-1)[0])
    vocoder = getattr(pipe, "vocoder", None)
    rate = getattr(getattr(vocoder, "config", None), "output_sampling_rate", None)
    if rate is None:
        rate = getattr(pipe, "audio_sample_rate", None) \
            or getattr(pipe, "audio_sampling_rate", None)
    if rate is None:
        audio_vae = getattr(pipe, "audio_vae", None)
        rate = getattr(getattr(audio_vae, "config", None), "sample_rate", None)
    return int(rate) if rate is not None else None


def write_wav(path: Path, audio: Audio) -> str:
    """``audio`` as a 32-bit float WAV file, atomically; returns its SHA-256."""
    return atomic.write_bytes(Path(path), encode(audio, "wav", "pcm_f32le", "flt"))


def read(path: Path) -> Audio:
    """Every audio sample of a file (a WAV, or an mp4's first audio stream) as float32."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        chunks = [_planar(frame) for frame in container.decode(stream)]
        rate = stream.rate
    return Audio(np.concatenate(chunks, axis=1).astype(np.float32), int(rate))


def _planar(frame) -> np.ndarray:
    """A decoded frame's samples as (channels, count), whether the codec gave them
    planar or interleaved."""
    samples = frame.to_ndarray()
    if frame.format.is_planar:
        return samples
    return samples.reshape(-1, len(frame.layout.channels)).T


def for_aac(audio: Audio) -> Audio:
    """``audio`` at a rate AAC carries: as it is, or resampled by FFmpeg's resampler
    (through PyAV) to ``AAC_RATE``, as long. The resampler holds back the last samples
    of its filter (all of a short waveform): silence after the end pushes them out, and
    what it makes of the silence is cut."""
    import av

    if aac_rate(audio.rate) == audio.rate:
        return audio
    layout = LAYOUTS[audio.samples.shape[0]]
    length = round(audio.samples.shape[1] * AAC_RATE / audio.rate)
    padded = np.pad(audio.samples, ((0, 0), (0, RESAMPLER_TAIL)))
    resampler = av.AudioResampler(format="fltp", layout=layout, rate=AAC_RATE)
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(padded), format="fltp",
                                       layout=layout)
    frame.sample_rate, frame.pts = audio.rate, 0
    chunks = [np.zeros((len(padded), 0), dtype=np.float32)]
    chunks += [out.to_ndarray() for out in (*resampler.resample(frame),
                                             *resampler.resample(None))]
    made = np.concatenate(chunks, axis=1)[:, :length]
    made = np.pad(made, ((0, 0), (0, length - made.shape[1])))  # what it held back
    return Audio(np.clip(made, -1.0, 1.0), AAC_RATE)


def encode(audio: Audio, container_format: str, codec: str, sample_format: str) -> bytes:
    """``audio`` alone in a container, in memory."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container_format) as container:
        stream = container.add_stream(codec, rate=audio.rate,
                                      layout=LAYOUTS[audio.samples.shape[0]])
        mux(container, stream, audio, sample_format)
    return buffer.getvalue()


def mux(container, stream, audio: Audio, sample_format: str = "fltp") -> None:
    """Encode ``audio`` into ``stream`` of ``container`` (started at time 0), in the
    encoder's frame size, and flush it."""
    import av

    size = stream.codec_context.frame_size or 1024
    layout = LAYOUTS[audio.samples.shape[0]]
    for start in range(0, audio.samples.shape[1], size):
        chunk = audio.samples[:, start:start + size]
        if sample_format == "flt":  # packed: one row, the channels interleaved
            chunk = chunk.T.reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(chunk),
                                           format=sample_format, layout=layout)
        frame.sample_rate, frame.pts = audio.rate, start
        container.mux(stream.encode(frame))
    container.mux(stream.encode())
