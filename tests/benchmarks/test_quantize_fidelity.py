"""benchmarks/quantize_fidelity.py's measures: PSNR and SSIM of two videos."""

import importlib.util

import numpy as np

from support import ROOT

SCRIPT = ROOT / "benchmarks" / "quantize_fidelity.py"
spec = importlib.util.spec_from_file_location("quantize_fidelity", SCRIPT)
fidelity = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fidelity)


def test_identical_videos_are_perfect_and_noise_costs_what_it_should():
    rng = np.random.default_rng(0)
    video = rng.integers(0, 256, (3, 32, 48, 3)).astype(np.uint8)
    assert fidelity.psnr(video, video) == float("inf")
    assert abs(fidelity.ssim(video, video) - 1.0) < 1e-12
    noisy = np.clip(video + rng.normal(0, 5, video.shape), 0, 255).round().astype(np.uint8)
    assert 33 < fidelity.psnr(noisy, video) < 35.5  # 20 log10(255 / ~5)
    worse = np.clip(video + rng.normal(0, 40, video.shape), 0, 255).round().astype(np.uint8)
    assert fidelity.ssim(worse, video) < fidelity.ssim(noisy, video) < 1.0
    assert abs(fidelity.ssim(video, noisy) - fidelity.ssim(noisy, video)) < 1e-12
