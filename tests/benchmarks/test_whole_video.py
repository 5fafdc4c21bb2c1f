"""benchmarks/gpu/whole_video.py: the GPU's whole-video benchmark, rehearsed on the CPU
as its --rehearse does before a GPU is lent, and its record of the peers that do not
install."""

import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "whole_video.py"


def _script():
    spec = importlib.util.spec_from_file_location("whole_video", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _wheel(folder: Path, name: str, requires: list[str]) -> Path:
    path = folder / f"{name}-1.0-py3-none-any.whl"
    metadata = "\n".join(["Metadata-Version: 2.1", f"Name: {name}", "Version: 1.0",
                          *(f"Requires-Dist: {r}" for r in requires)])
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}-1.0.dist-info/METADATA", metadata)
    return path


def test_a_peer_is_recorded_with_what_the_machine_lacks(tmp_path):
    import torch

    wheel = _wheel(tmp_path, "peer", [
        "torch==0.0.1",                                  # another version
        "surely-not-installed-here>=1",                  # missing
        "pyyaml",                                        # met
        'also-not-here; extra == "diffusion"',           # only with the extra
        'nor-this; sys_platform == "neverland"'])       # not for this platform
    unmet = _script().unmet(wheel, "peer")
    assert unmet == [f"torch==0.0.1 ({torch.__version__} here)",
                     "surely-not-installed-here>=1 (missing)"]
    assert "also-not-here; extra == \"diffusion\" (missing)" in \
        _script().unmet(wheel, "peer[diffusion]")


@pytest.mark.slow
def test_the_rehearsal_times_a_whole_video_on_each_side(tmp_path):
    wheels = tmp_path / "peers"
    wheels.mkdir()
    _wheel(wheels, "fastvideo", ["surely-not-installed-here"])
    done = subprocess.run([sys.executable, str(SCRIPT), "--rehearse", "--out", str(tmp_path),
                           "--checkpoint", str(tmp_path / "model"), "--peers", str(wheels),
                           "--only", "porter", "diffusers"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "whole-video.json").read_text())
    fastvideo, sglang = result["peers"]
    assert not fastvideo["installs"] and fastvideo["unmet"] == \
        ["surely-not-installed-here (missing)"]
    assert sglang == {"peer": "sglang", "error": "no sglang wheel carried"}
    assert result["checkpoint"]["weight_bytes"] > 0
    porter, diffusers = result["porter"], result["diffusers"]
    assert "error" not in porter, porter.get("log_tail")
    assert porter["frames"] == [5, 64, 96, 3]
    assert porter["warm"]["steps"] == 4 and porter["warm"]["decode_s"] > 0
    assert porter["cold"]["compile_s"] > 0 and porter["warm"]["compile_s"] == 0
    assert 0 < porter["startup_s"] < porter["wall_s"]
    assert "error" not in diffusers, diffusers.get("log_tail")
    assert diffusers["warm_s"] > 0 and diffusers["device"] == "cpu"
    assert "porter-fast" not in result  # --only
