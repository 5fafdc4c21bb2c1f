"""benchmarks/tpu_compile.py's whole-video column: a report's own bound, or the same sum
from an older report's rows (the stored reports, no compile)."""

import importlib.util
import json
import sys

import pytest

from support import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports results_io beside it
SCRIPT = ROOT / "benchmarks" / "tpu_compile.py"
spec = importlib.util.spec_from_file_location("tpu_compile", SCRIPT)
tpu_compile = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tpu_compile)
STORED = {r["recipe"]: r["report"] for r in json.loads(tpu_compile.RESULTS.read_text())
          if r.get("report")}


def test_an_older_report_sums_its_stages_as_porter_compile_does():
    """The same sum, done from the causvid report's rows with its own bound taken away,
    equals the bound porter compile gave it."""
    report = dict(STORED["wan1.3b-causvid.yaml"], video=None)
    assert float(tpu_compile.whole_video("wan1.3b-causvid.yaml", report)) == pytest.approx(
        STORED["wan1.3b-causvid.yaml"]["video"]["bound_s"], abs=0.005)
