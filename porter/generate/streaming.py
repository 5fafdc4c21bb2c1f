"""Frames as they are made: each chunk the decode hands over goes to the call's
``on_frames`` and, in a run directory, to ``stream.mp4`` (a fragmented MP4 a player
starts before the video is done: ``porter.rundir.video.Stream``), with when the first
frames could be shown in the call's timings."""

from __future__ import annotations

import contextlib
import time

from porter.generate.call import Call
from porter.rundir import outputs
from porter.rundir.video import Stream
from porter.runtime import distributed, notices


def writes_stream(call: Call) -> bool:
    """Does this call write ``stream.mp4``: a run directory (process 0's), a video, and
    ``output.stream``?"""
    output = call.recipe.output
    return (call.directory is not None and distributed.writes() and output.video
            and output.stream)


def wanted(call: Call) -> bool:
    """Does anything take this call's frames as they come (``stream.mp4``, the call's
    ``on_frames``)? A pipeline's own loop is left alone where nothing does. The same
    answer on every process of a multi-process run (the decode's programs must be the
    same on all), though process 0 alone writes the file."""
    output = call.recipe.output
    return (call.directory is not None and output.streams) or \
        call.on_frames is not None


@contextlib.contextmanager
def stream(call: Call):
    """``on_frames(chunk)`` for the decode, for the length of the block. Records in
    ``call.timings["stream"]``: the chunks, and seconds from the call's start to the
    first chunk (``first_chunk_s``), to the first frame a player can show from
    ``stream.mp4`` (``first_playable_s``; None without the file) and to the last
    chunk handed on, the file complete (``done_s``)."""
    writer = Stream(call.directory / outputs.STREAM, call.recipe.output.fps) \
        if writes_stream(call) else None
    found = {"file": outputs.STREAM if writer else None, "chunks": 0,
             "first_chunk_s": None, "first_playable_s": None, "done_s": None}

    def since_start() -> float:
        return round(time.perf_counter() - call.started, 4)

    def on_frames(frames) -> None:
        nonlocal writer
        found["chunks"] += 1
        if found["first_chunk_s"] is None:
            found["first_chunk_s"] = since_start()
        if writer is not None:
            try:
                writer.add(frames)
            except Exception as exc:  # noqa: BLE001 - a full disk, the encoder
                writer = found["file"] = _given_up(writer, exc)
            else:
                if found["first_playable_s"] is None and writer.playable:
                    found["first_playable_s"] = since_start()
        if call.on_frames is not None:
            call.on_frames(frames)

    try:
        yield on_frames
    finally:
        if writer is not None:
            try:
                writer.close()
            except Exception as exc:  # noqa: BLE001 - the video matters more
                writer = found["file"] = _given_up(writer, exc)
            if writer is not None and found["first_playable_s"] is None and writer.frames:
                found["first_playable_s"] = since_start()  # one chunk: at its close
        found["done_s"] = since_start()
        call.timings["stream"] = found


def _given_up(writer: Stream, exc: Exception) -> None:
    """A stream that cannot be written is given up with a warning, its file removed:
    it is there to show the video early, and the run goes on to write video.mp4."""
    with contextlib.suppress(Exception):
        writer.close()
    writer.path.unlink(missing_ok=True)
    notices.warn(f"stream.mp4 is not written: {type(exc).__name__}: {exc}",
                 hint="the run goes on and writes video.mp4; output.stream: false "
                      "turns the stream off")
    return None
