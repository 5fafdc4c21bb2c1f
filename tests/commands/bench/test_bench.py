"""porter bench keeps working (a benchmark, not a timed test: no time is asserted)."""

import json

from porter import cli

from support import RECIPES


def test_bench_reports_both_sides(capsys):
    assert cli.main(["bench", str(RECIPES / "wan-tiny.yaml"), "--steps", "2", "--json",
                     "mesh.dp=1"]) == 0
    result = json.loads(capsys.readouterr().out)
    step = result["step_s"]
    assert step["porter"] > 0 and step["pytorch_eager"] > 0
    assert abs(step["ratio"] - step["porter"] / step["pytorch_eager"]) < 0.01
    assert result["flops_per_step"] > 0 and result["matmul_peak_flops_per_s"] > 0
    assert result["memory"]["host_peak_rss_bytes"] > 0
    assert result["inputs"]["hidden_states"] == [1, 16, 5, 8, 8]
    # cold: nothing in the private cache; warm: the same programs, loaded from it
    cold, warm = result["compile"]["cold"], result["compile"]["warm"]
    assert cold["cache_hits"] == 0 and cold["cache_misses"] > 0
    assert warm["cache_misses"] == 0 and warm["cache_hits"] == cold["cache_misses"]
    assert warm["traces_loaded"] == 1  # the step's traced program, read back from disk
    assert result["quantize"] is None


def test_bench_says_what_quantizing_does_to_the_step_it_times(capsys):
    assert cli.main(["bench", str(RECIPES / "wan-tiny.yaml"), "--steps", "1",
                     "mesh.dp=1", "quantize.format=int8"]) == 0
    out = capsys.readouterr().out
    # the tiny Wan's two blocks: 4 attention projections twice, and the FFN's two
    assert "quantized: int8 in 20 linear layers (PyTorch eager runs unquantized)" in out
    assert "no forecast of a TPU's or GPU's" in out


def test_bench_times_a_whole_video_beside_diffusers_in_a_fresh_process():
    """`porter bench --video` as a user runs it: Porter's cold video compiles everything
    (its caches private and empty), the warm one nothing, with its stages from the run
    record; diffusers' pipeline makes the same video from the same checkpoint."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    out = subprocess.run([sys.executable, "-m", "porter.cli", "bench",
                          str(RECIPES / "wan-tiny.yaml"), "--video", "--json",
                          "generate.steps=2"], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    ported, peer = result["porter"], result["diffusers"]
    assert ported["frames"] == [17, 64, 64, 3]
    assert ported["cold"]["compile_s"] > 0 and ported["warm"]["compile_s"] < \
        ported["cold"]["compile_s"]
    assert ported["warm"]["steps"] == 2 and ported["warm"]["decode_s"] > 0
    assert ported["warm"]["encode_s"] > 0  # encoded again, as diffusers encodes it
    assert peer["warm_s"] > 0 and peer["device"] == "cpu"
    assert result["warm_ratio"] == round(ported["warm_s"] / peer["warm_s"], 3)
    assert result["diffusers_torch_compile"] is None
