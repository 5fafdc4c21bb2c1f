"""Write and read .mp4 files (PyAV, H.264)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_mp4(path: Path, frames: np.ndarray, fps: int) -> str:
    """Write uint8 frames (count, height, width, 3) atomically to ``path``; returns the
    file's SHA-256."""
    from porter import outputs

    return outputs.write_bytes(Path(path), encode_mp4(frames, fps))


def encode_mp4(frames: np.ndarray, fps: int) -> bytes:
    """H.264 in MP4, in memory (a video is small beside the model that made it)."""
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
        stream.options = {"crf": "18"}
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    return buffer.getvalue()


def read_mp4(path: Path) -> tuple[np.ndarray, float]:
    """Frames as uint8 (count, height, width, 3) and the stream's frame rate."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        return np.stack(frames), float(stream.average_rate)
