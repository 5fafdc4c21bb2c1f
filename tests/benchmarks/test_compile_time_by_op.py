"""benchmarks/compile_time_by_op.py: libtpu's backend log charged to HLO operations and
the computations they are in (the parsing only: the compile itself is libtpu's)."""

import importlib.util

from support import ROOT

SCRIPT = ROOT / "benchmarks" / "compile_time_by_op.py"
spec = importlib.util.spec_from_file_location("compile_time_by_op", SCRIPT)
by_op = importlib.util.module_from_spec(spec)
spec.loader.exec_module(by_op)

HLO = """HloModule jit_call_torch, is_scheduled=true

%fused_computation.1 (param_0: bf16[8,128]) -> bf16[8,128] {
  %param_0 = bf16[8,128]{1,0} parameter(0)
  ROOT %negate.1 = bf16[8,128]{1,0} negate(%param_0)
}

%body (p: (s32[], bf16[8,128])) -> (s32[], bf16[8,128]) {
  %fusion.7 = bf16[8,128]{1,0} fusion(%gte), kind=kLoop, calls=%fused_computation.1
  ROOT %tuple.1 = (s32[], bf16[8,128]) tuple(%i, %fusion.7)
}

ENTRY %main.16_spmd (param.1: bf16[8,128]) -> bf16[8,128] {
  %copy.3 = bf16[8,128]{0,1} copy(%param.1)
  ROOT %while.9 = (s32[], bf16[8,128]) while(%tuple.0), body=%body
}
"""

LOG = """\
I1125 05:43:16.984608    4398 deepsea_compiler_backend.cc:3769] [<no-hlo-instruction>] LLO optimizing 6,511 instructions
I1125 05:43:17.000000    4403 deepsea_compiler_backend.cc:3769] [fusion.7] LLO optimizing 14,810 instructions
I1125 05:43:17.500000    4404 deepsea_compiler_backend.cc:3769] [copy.3] LLO optimizing 233 instructions
I1125 05:43:18.250000    4403 deepsea_compiler_backend.cc:2846] post-bundle-packing non-empty bundle count: 6
I1125 05:43:18.750000    4404 deepsea_compiler_backend.cc:3643] Done with Register Allocator
I1125 05:43:19.000000    4403 deepsea_compiler_backend.cc:3769] [copy.3] LLO optimizing 12 instructions
I1125 05:43:19.100000    4403 deepsea_compiler_backend.cc:3643] Done with Register Allocator
not a log line
I1125 05:43:20.984608    4398 deepsea_compiler_backend.cc:3769] [<no-hlo-instruction>] LLO optimized 756,395 instructions
"""


def test_instructions_are_placed_in_their_computations():
    where = by_op.computations(HLO)
    assert where["fusion.7"] == "body"
    assert where["copy.3"] == where["while.9"] == "main.16_spmd"
    assert where["negate.1"] == "fused_computation.1"


def test_each_threads_time_goes_to_the_operation_it_last_started():
    spent = by_op.thread_seconds(LOG)
    # thread 4403: fusion.7 from 17.0 to 19.0 (its next start), then copy.3 to 19.1;
    # thread 4404: copy.3 from 17.5 to its next line at 18.75
    assert round(spent["fusion.7"], 3) == 2.0
    assert round(spent["copy.3"], 3) == 0.1 + 1.25
    assert round(spent["<no-hlo-instruction>"], 3) == 4.0
