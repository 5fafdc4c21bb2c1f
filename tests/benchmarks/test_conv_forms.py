"""benchmarks/conv_forms.py: one causal convolution compiled for a TPU in each form,
the compiler's cycles summed by kind."""

import json
import subprocess
import sys

from support import ROOT
from support.aot import needs_libtpu

SCRIPT = ROOT / "benchmarks" / "conv_forms.py"


@needs_libtpu
def test_every_form_compiles_the_same_convolution_and_is_saved(tmp_path):
    """In a fresh process, as the script runs (JAX set to the CPU before it starts)."""
    saved = tmp_path / "forms.json"
    for _ in range(2):  # a second run appends its record
        out = subprocess.run([sys.executable, SCRIPT, "--target", "v5e-8", "--channels",
                              "8", "--frames", "1", "--height", "16", "--width", "32",
                              "--save", saved], capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stderr
    records = json.loads(saved.read_text())
    assert len(records) == 2 and records[0]["channels"] == 8
    rows = {row["form"]: row for row in records[-1]["rows"]}
    assert list(rows) == ["split-width", "split-height", "channels-last", "one-chip",
                          "row-blocks", "kept-in-blocks", "blocks-split-width"]
    for row in rows.values():
        assert row["cycles"] == sum(row["by_kind"].values()) > 0
        assert "convolution" in row["by_kind"]
    # one chip's share: 3 frames in, 1 out, 16 rows, 32 / 8 + 2 columns in, 4 out (XLA
    # leaves out the taps on the height's zero padding, which the row blocks do not have)
    share = 2 * 8 * 8 * 27 * 1 * 16 * 4
    assert rows["row-blocks"]["flops_per_chip"] == share
    assert 0.9 * share < rows["one-chip"]["flops_per_chip"] <= share
    assert "split-width" in out.stdout and "M cycles" in out.stdout
    # the whole image in 8 blocks of 2 rows, the width over the chips: each chip's 4
    # columns of each block, not the whole image's 8 times that (XLA's count adds the
    # halos' joins and, at this size, taps on the width's halo, as for kept-in-blocks)
    assert share <= rows["blocks-split-width"]["flops_per_chip"] < 1.5 * share
