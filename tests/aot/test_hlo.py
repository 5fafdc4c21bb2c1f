"""What the compiled program says: collectives counted for each trip of a loop."""

from porter.aot import hlo


def test_collectives_count_each_trip_of_a_loop():
    text = """HloModule m

%body (p: (s32[], bf16[8,16])) -> (s32[], bf16[8,16]) {
  %ag = bf16[8,64]{1,0} all-gather(%x), channel_id=1, replica_groups=[2,4]<=[8], dimensions={1}
  %ar = f32[8,16]{1,0} all-reduce(%y), channel_id=2, replica_groups={{0,1},{2,3},{4,5},{6,7}}, to_apply=%add
}

%cond (p: (s32[], bf16[8,16])) -> pred[] {
  %c = s32[] constant(40)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

ENTRY %main (a: bf16[8,16]) -> bf16[8,16] {
  %w = (s32[], bf16[8,16]) while(%t), condition=%cond, body=%body
  %s = bf16[8,64]{1,0} all-gather-start(%a), replica_groups=[2,4]<=[8]
  %d = bf16[8,64]{1,0} all-gather-done(%s)
}
"""
    found = hlo.collectives(text, 8)
    assert found["all-gather"].count == 41 and found["all-reduce"].count == 40
    assert found["all-reduce"].bytes == 40 * 8 * 16 * 4
    # a ring all-reduce over 2 chips sends half the bytes twice over: once each way
    assert found["all-reduce"].traffic_bytes == 40 * 8 * 16 * 4
    assert found["all-gather"].traffic_bytes == 41 * (8 * 64 * 2) * 3 // 4


def test_matmul_flops_are_counted_by_operand_kind_for_every_trip():
    """An int8 dot in a loop body of 40 trips counts 40 times, beside a bf16 dot run
    once and an fp8 one inside a fusion: each under the kind its operands have (what
    the compiler kept of a low-precision matmul)."""
    text = """HloModule m

%fused (p0: f8e4m3fn[4,8], p1: f8e4m3fn[8,2]) -> bf16[4,2] {
  %p0 = f8e4m3fn[4,8]{1,0} parameter(0)
  %p1 = f8e4m3fn[8,2]{1,0} parameter(1)
  ROOT %d = bf16[4,2]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (p: (s32[], s8[16,32])) -> (s32[], s8[16,32]) {
  %x = s8[16,32]{1,0} parameter(0)
  %w = s8[32,64]{1,0} parameter(1)
  %q = s32[16,64]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%cond (p: (s32[], s8[16,32])) -> pred[] {
  %c = s32[] constant(40)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

ENTRY %main (a: bf16[8,16], b: bf16[16,4]) -> bf16[8,4] {
  %w = (s32[], s8[16,32]) while(%t), condition=%cond, body=%body
  %o = bf16[8,4]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %f = bf16[4,2]{1,0} fusion(%x, %y), kind=kOutput, calls=%fused
}
"""
    assert hlo.matmul_flops(text) == {"int8": 40 * 2 * 16 * 64 * 32,
                                      "bf16": 2 * 8 * 4 * 16, "fp8": 2 * 4 * 2 * 8}
