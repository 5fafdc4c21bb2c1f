"""benchmarks/gpu/attention.py on the CPU, shrunk: each backend's row, and a backend
that cannot run here reported with its reason while the others go on."""

import importlib.util
import json

from support import ROOT

SCRIPT = ROOT / "benchmarks" / "gpu" / "attention.py"
spec = importlib.util.spec_from_file_location("attention_alone", SCRIPT)
alone = importlib.util.module_from_spec(spec)
spec.loader.exec_module(alone)


def test_each_backend_is_timed_and_measured_against_float32(tmp_path, capsys):
    out = tmp_path / "attention.json"
    assert alone.main(["--tokens", "640", "--text", "32", "--heads", "1", "--dim", "64",
                       "--backends", "reference,fp8-emulated,cudnn-fp8",
                       "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == results
    assert sorted(results["shapes"]) == ["cross peaked (640x32)", "cross random (640x32)",
                                         "self peaked (640x640)", "self random (640x640)"]
    for row in results["shapes"].values():
        assert row["reference"]["ms"] > 0 and row["reference"]["tflop_per_s"] >= 0
        assert row["reference"]["vs_float32"]["relative_l2"] < 0.01  # bfloat16's rounding
        assert 0.01 < row["fp8-emulated"]["vs_float32"]["relative_l2"] < 0.25
        assert "cuDNN" in row["cudnn-fp8"]["error"]  # no GPU here: said, not raised


def test_a_window_is_timed_against_its_masked_float32_and_its_own_dense(tmp_path):
    out = tmp_path / "attention.json"
    assert alone.main(["--tokens", "640", "--text", "32", "--heads", "1", "--dim", "64",
                       "--backends", "reference,cudnn", "--grid", "4x10x16",
                       "--window", "1x10x16/1x0x0/0", "--json", str(out)]) == 0
    found = json.loads(out.read_text())["windows"]["1x10x16/1x0x0/0"]
    assert found["tokens"] == 640 and found["groups"] == 2  # edge frames, middle frames
    assert found["mask_fraction"] == 10 / 16
    assert found["reference"]["vs_float32"]["relative_l2"] < 0.01
    assert found["reference"]["ms"] > 0 and found["reference"]["vs_dense"] > 0
    assert "error" in found["cudnn"]  # no GPU here
