"""benchmarks/hlo_cycles.py: a compiled program's cycle estimates summed by kind and by
the PyTorch operation each instruction came from."""

import importlib.util

from support import ROOT

SCRIPT = ROOT / "benchmarks" / "hlo_cycles.py"
spec = importlib.util.spec_from_file_location("hlo_cycles", SCRIPT)
hlo_cycles = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hlo_cycles)

HLO = """HloModule m, is_scheduled=true

%fused_conv (p0: bf16[8,16]) -> f32[8,16] {
  ROOT %convolution.1 = f32[8,16]{1,0} convolution(%p0, %w), window={size=3}
}

ENTRY %main (a: bf16[8,16]) -> f32[8,16] {
  %fusion.1 = f32[8,16]{1,0} fusion(%a), kind=kOutput, calls=%fused_conv, metadata={op_name="jit(call_torch)/aten::convolution/conv_general_dilated"}, backend_config={"estimated_cycles":"600"}
  %copy.1 = f32[8,16]{0,1} copy(%a), metadata={op_name="args[2][3]"}, backend_config={"estimated_cycles":"300"}
  %slice.1 = f32[4,16]{0,1} slice(%copy.1), slice={[0:4], [0:16]}, backend_config={"estimated_cycles":"100"}
}
"""


def test_cycles_are_summed_by_kind_and_by_pytorch_operation(tmp_path, capsys):
    found = hlo_cycles.summary(HLO, top=2)
    assert found["cycles"] == 1000 and found["instructions"] == 3
    assert found["by_kind"] == {"convolution": 600, "layout copy": 300, "slice": 100}
    assert found["by_source"] == {"aten::convolution": 600, "(a program input)": 300,
                                  "(no source)": 100}
    assert [row[0] for row in found["largest"]] == ["fusion.1", "copy.1"]
    (tmp_path / "01-vae.decode.hlo").write_text(HLO)
    (tmp_path / "02-other.hlo").write_text("HloModule m\n")
    assert hlo_cycles.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "01-vae.decode.hlo: 0.00 M cycles over 3 instructions" in out
    assert " 60.0%  convolution" in out and " 60.0%  aten::convolution" in out
    assert "02-other.hlo: no cycle estimates" in out
