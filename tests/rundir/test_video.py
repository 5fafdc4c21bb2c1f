"""The video's bytes are a function of its frames: ``run.json`` names the mp4 by its
SHA-256, so two runs that made the same frames must write the same file.

libx264 left to itself gave other bytes for the same frames: its thread count
comes from the CPUs the process may use, and on CPUs with AVX-512 its output
changed from one encode to the next even on one thread (13 different files of 40
encodes of the clip below, up to 25/255 apart once decoded).
"""

import hashlib
import os
import subprocess
import sys

import numpy as np

from porter.rundir import video

CHILD = """\
import hashlib, os, sys
import numpy as np
from porter.rundir import video
cpus = [int(c) for c in sys.argv[2].split(",")]
os.sched_setaffinity(0, cpus)  # x264's "auto" thread count follows this
frames = np.load(sys.argv[1])
print(" ".join(hashlib.sha256(video.encode_mp4(frames, 16)).hexdigest() for _ in range(3)))
"""


def clip(count=17, height=240, width=320) -> np.ndarray:
    """Moving smooth shapes with noise: motion and texture for the encoder to decide
    about (flat or pure-noise frames leave it nothing to vary on)."""
    rng = np.random.default_rng(0)
    y = np.linspace(0, 1, height)[:, None, None]
    x = np.linspace(0, 1, width)[None, :, None]
    frames = [(np.sin(8 * x + t / 3) * np.cos(5 * y - t / 5) + 1) * 127
              + rng.normal(0, 8, (height, width, 3)) for t in range(count)]
    return np.stack(frames).clip(0, 255).astype(np.uint8)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_same_frames_give_the_same_bytes_in_one_process():
    frames = clip()
    found = {digest(video.encode_mp4(frames, 16)) for _ in range(16)}
    assert len(found) == 1, f"{len(found)} different files from 16 encodes"


def test_the_same_frames_give_the_same_bytes_across_processes(tmp_path):
    """Two processes at once (one on one CPU, one on every CPU it may use) and this
    one: every encode the same file."""
    frames = clip()
    np.save(tmp_path / "frames.npy", frames)
    cpus = sorted(os.sched_getaffinity(0))
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "frames.npy"),
                                  ",".join(map(str, pinned))], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
                for pinned in (cpus[:1], cpus)]
    found = {digest(video.encode_mp4(frames, 16))}
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err
        found.update(out.split())
    assert len(found) == 1, f"{len(found)} different files from 7 encodes"


def test_the_video_still_shows_the_frames(tmp_path):
    """The conversion done before the encoder keeps colours where they were."""
    y = np.linspace(0, 1, 240)[:, None]
    x = np.linspace(0, 1, 320)[None, :]
    frames = np.stack([np.stack([(np.sin(8 * x + t / 3) * np.cos(5 * y) + 1) * 127,
                                 x * 255 + 0 * y, y * 255 + 0 * x], axis=-1)
                       for t in range(5)]).clip(0, 255).astype(np.uint8)
    video.write_mp4(tmp_path / "v.mp4", frames, 16)
    decoded, fps = video.read_mp4(tmp_path / "v.mp4")
    assert decoded.shape == frames.shape and fps == 16
    # H.264 is lossy: close (measured 1.4 levels of 255 on average), not equal
    assert np.abs(decoded.astype(int) - frames.astype(int)).mean() < 3
