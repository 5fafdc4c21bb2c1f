"""Write and read .mp4 files (PyAV, H.264)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from porter.rundir import audio
from porter.rundir.audio import Audio
from porter.runtime import atomic


def write_mp4(path: Path, frames: np.ndarray, fps: int, sound: Audio | None = None) -> str:
    """Write uint8 frames (count, height, width, 3), and their sound if any,
    atomically to ``path``; returns the file's SHA-256."""

    return atomic.write_bytes(Path(path), encode_mp4(frames, fps, sound))


def encode_mp4(frames: np.ndarray, fps: int, sound: Audio | None = None) -> bytes:
    """H.264 in MP4, in memory (a video is small beside the model that made it);
    ``sound``: an AAC stream beside it, both starting at time 0.

    The bytes are a function of the frames (the run record hashes them): the
    conversion to YUV is swscale's bit-exact one, and libx264 runs with a fixed
    thread count and without its AVX-512 code (``_x264_options``)."""
    import io

    import av

    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"expected uint8 frames (n, h, w, 3), got {frames.dtype} "
                         f"{frames.shape}")
    buffer = io.BytesIO()
    height, width = frames.shape[1:3]
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "18", **_x264_options()}
        sound_stream = None
        if sound is not None:
            sound = audio.for_aac(sound)
            sound_stream = container.add_stream("aac", rate=sound.rate,
                                                layout=audio.LAYOUTS[sound.samples.shape[0]])
        for frame in frames:
            container.mux(stream.encode(_yuv420(frame)))
        container.mux(stream.encode())
        if sound_stream is not None:
            audio.mux(container, sound_stream, sound)
    return buffer.getvalue()


class Stream:
    """A fragmented MP4 written as the frames come (``add``, chunk by chunk): every
    frame its own fragment behind one header (``empty_moov``), each on disk as soon
    as the muxer has it, so a player (a browser's Media Source Extensions, or one that
    reads a growing file) starts before the last frame exists. The muxer closes a
    fragment when the next frame arrives: a chunk's last frame reaches the file with
    the next chunk's first, or at ``close``.

    For showing, not keeping: x264 encodes with no lookahead and no B-frames (each
    frame's packet comes out as it goes in), not ``encode_mp4``'s settings, so its
    bytes are not the finished video's (``write_mp4`` writes that from the same frames).
    """

    def __init__(self, path: Path, fps: int):
        self.path, self.fps = Path(path), fps
        self.frames = 0
        self._file = self._container = self._stream = None
        self._header = None  # the file's size once its header is written

    @property
    def playable(self) -> bool:
        """Does the file hold a frame a player can show (a fragment past the header)?"""
        return self._header is not None and self._file.tell() > self._header

    def add(self, frames: np.ndarray) -> None:
        """Encode ``frames`` (uint8 (count, height, width, 3)); the header with the first."""
        if self._container is None:
            self._open(*frames.shape[1:3])
        for frame in frames:
            self._container.mux(self._stream.encode(_yuv420(frame)))
        self._file.flush()
        self.frames += len(frames)

    def _open(self, height: int, width: int) -> None:
        import av

        self._file = open(self.path, "wb")  # closed by ``close`` whatever fails below
        self._container = av.open(self._file, mode="w", format="mp4", options={
            "movflags": "frag_every_frame+empty_moov+default_base_moof",
            "flush_packets": "1"})  # each fragment to the file as it is made
        self._stream = self._container.add_stream("libx264", rate=self.fps)
        self._stream.width, self._stream.height = width, height
        self._stream.pix_fmt = "yuv420p"
        self._stream.options = {"crf": "18", "tune": "zerolatency", **_x264_options()}
        self._container.start_encoding()  # the header (no frame needed: empty_moov)
        self._file.flush()
        self._header = self._file.tell()

    def close(self) -> None:
        """The last frames to the file; the file complete. Safe to call twice, and
        after a failed ``add``."""
        container, self._container = self._container, None
        try:
            if container is not None:
                if self._stream is not None:
                    container.mux(self._stream.encode())
                container.close()
        finally:
            if self._file is not None:
                self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _yuv420(frame: np.ndarray):
    """One RGB frame as the encoder's YUV 4:2:0, converted here rather than by the
    encoder: swscale's bit-exact arithmetic (its SIMD paths may otherwise round
    differently from one CPU to another), one thread."""
    import av
    from av.video.reformatter import Interpolation

    rgb = av.VideoFrame.from_ndarray(frame, format="rgb24")
    return rgb.reformat(format="yuv420p", threads=1, interpolation=Interpolation.BILINEAR
                        | Interpolation.ACCURATE_RND | Interpolation.BITEXACT)


#: x264's frame threads give repeatable output for a given thread count, but "auto"
#: takes the count from the CPUs the process may use: a fixed one keeps the bytes the
#: same on every machine (and under taskset).
X264_THREADS = 4


def _x264_options() -> dict:
    """libx264 options that make its output a function of its input. On CPUs with
    AVX-512, x264 (core 165, as PyAV ships it) gives other bytes from run to run for
    the same frames, even single-threaded (measured on an AMD EPYC: 13 different files
    from 40 encodes of one 17-frame 320x240 clip, up to 25/255 apart once decoded; one
    file with mbtree off, or with its AVX-512 code off): its instruction set is capped
    at AVX2, which every AVX-512 CPU has (AVX2 code is bit-exact with x264's C)."""
    options = {"threads": str(X264_THREADS)}
    if _has_avx512():
        options["x264-params"] = "asm=AVX2"
    return options


def _has_avx512() -> bool:
    """Would x264 use AVX-512 here? numpy's CPU detection asks the CPU and the OS,
    as x264's does."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:  # numpy 1
        try:
            from numpy.core._multiarray_umath import __cpu_features__ as features
        except ImportError:
            return False
    return bool(features.get("AVX512F"))


def read_mp4(path: Path) -> tuple[np.ndarray, float]:
    """Frames as uint8 (count, height, width, 3) and the stream's frame rate."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        return np.stack(frames), float(stream.average_rate)
