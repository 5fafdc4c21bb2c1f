"""What every family shares: frames handed on as a pipeline decodes them (Handover)."""

import numpy as np

from porter.families.base import Handover
from porter.runtime import notices


def _video(count: int) -> np.ndarray:
    return np.arange(count * 2 * 2 * 3, dtype=np.uint8).reshape(count, 2, 2, 3)


def test_chunks_go_on_less_what_a_trim_may_take_then_the_rest_of_the_video():
    video, made = _video(15), []
    handover = Handover(made.append, hold=3)
    for start in (0, 5, 10):  # three chunks of 5 frames
        handover.add(video[start:start + 5])
    handover.finish(video[:13])  # the pipeline trimmed its 15 frames to 4n+1
    assert [len(c) for c in made] == [2, 5, 5, 1]
    assert np.array_equal(np.concatenate(made), video[:13])


def test_a_chunk_shorter_than_the_hold_waits_for_the_next():
    video, made = _video(7), []
    handover = Handover(made.append, hold=3)
    handover.add(video[:2])
    assert made == []
    handover.add(video[2:7])
    handover.finish(video)
    assert [len(c) for c in made] == [4, 3]
    assert np.array_equal(np.concatenate(made), video)


def test_frames_changed_after_they_went_on_are_said(monkeypatch):
    monkeypatch.setattr(notices, "_given", [])  # a warning is given once a process
    video, made = _video(6), []
    handover = Handover(made.append)
    handover.add(video[:3])
    changed = video.copy()
    changed[1] += 1
    handover.finish(changed)
    assert any("differ from its finished video" in w for w in notices.given())
    assert np.array_equal(made[1], changed[3:])  # the rest comes from the video


def test_nothing_is_kept_without_a_taker():
    handover = Handover(None, hold=3)
    handover.add(_video(5))
    handover.finish(_video(5))
    assert handover.handed == [] and handover.count == 0
