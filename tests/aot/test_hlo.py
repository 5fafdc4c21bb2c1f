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
