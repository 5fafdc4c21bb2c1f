"""benchmarks/hlo_cycles.py: a compiled program's cycle estimates summed by kind and by
the PyTorch operation each instruction came from."""

import importlib.util

import pytest

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
  %fusion.1 = f32[8,16]{1,0} fusion(%a), kind=kOutput, calls=%fused_conv, metadata={op_name="jit(call_torch)/aten::convolution/conv_general_dilated"}, backend_config={"estimated_cycles":"6000000"}
  %copy.1 = f32[8,16]{0,1} copy(%a), metadata={op_name="args[2][3]"}, backend_config={"estimated_cycles":"3000000"}
  %slice.1 = f32[4,16]{0,1} slice(%copy.1), slice={[0:4], [0:16]}, backend_config={"estimated_cycles":"1000000"}
}
"""


def test_cycles_are_summed_by_kind_and_by_pytorch_operation(tmp_path, capsys):
    found = hlo_cycles.summary(HLO, top=2)
    assert found["cycles"] == 10_000_000 and found["instructions"] == 3
    assert found["by_kind"] == {"convolution": 6_000_000, "layout copy": 3_000_000,
                                "slice": 1_000_000}
    assert found["by_source"] == {"aten::convolution": 6_000_000,
                                  "(a program input)": 3_000_000,
                                  "(no source)": 1_000_000}
    assert [row[0] for row in found["largest"]] == ["fusion.1", "copy.1"]
    for compile in ("a", "b"):  # two compiles' folders, their files named alike
        (tmp_path / compile).mkdir()
        (tmp_path / compile / "01-vae.decode.hlo").write_text(HLO)
    (tmp_path / "a" / "02-other.hlo").write_text("HloModule m\n")
    assert hlo_cycles.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    for compile in ("a", "b"):
        assert f"{tmp_path / compile / '01-vae.decode.hlo'}: 10.00 M cycles over 3 " \
               "instructions" in out
    assert " 60.0%  convolution" in out and " 60.0%  aten::convolution" in out
    assert "02-other.hlo: no cycle estimates" in out


def test_a_path_that_is_not_there_is_said(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        hlo_cycles.main([str(tmp_path / "nope")])
    assert stopped.value.code == 2
    assert "no such file or folder" in capsys.readouterr().err
