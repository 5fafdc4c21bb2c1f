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


def test_a_windows_taps_over_padding_or_between_dilated_values_are_no_work():
    """The forms XLA writes matmuls in: a matmul split over chips as a window of 4 over
    one value padded by 3 on each side (one tap of the 4 meets a value), a batched
    matmul as a window over an input dilated by its size (one tap); and a plain 3-wide
    convolution over 8 values padded by 1 (22 of 24 taps meet one)."""
    text = """HloModule m

ENTRY %main (a: bf16[32,8,1], b: bf16[4,8,8], c: f32[4,32,32], d: f32[4,32,32], e: f32[1,8,16], k: f32[3,16,16]) -> f32[] {
  %split = bf16[32,4,8]{0,2,1} convolution(%a, %b), window={size=4 pad=3_3 rhs_reversal=1}, dim_labels=bf0_0oi->b0f
  %batched = f32[4,32,32]{1,2,0} convolution(%c, %d), window={size=4 stride=3 lhs_dilate=4}, dim_labels=0bf_0io->0bf
  %conv = f32[1,8,16]{2,1,0} convolution(%e, %k), window={size=3 pad=1_1}, dim_labels=b0f_0io->b0f
}
"""
    found = hlo.matmul_flops(text)
    split = 2 * 32 * 4 * 8 * 8 * 1  # out x features in x 1 tap
    batched = 2 * 4 * 32 * 32 * 32 * 1
    conv = 2 * 8 * 16 * 16 * 22 / 8
    assert found == {"bf16": split, "f32": batched + conv}


def test_a_halo_exchange_counts_its_data_not_its_contexts():
    """An async collective-permute's result is (operand, result, u32[], u32[]): the
    bytes moved are the result's (a VAE's halo columns), not the two context scalars."""
    text = """HloModule m

ENTRY %main (a: f32[1,96,2,64,1]) -> f32[1,96,2,64,1] {
  %s = (f32[1,96,2,64,1]{4,3,2,1,0}, f32[1,96,2,64,1]{4,3,2,1,0}, u32[], u32[]) collective-permute-start(%a), channel_id=1, source_target_pairs={{0,1},{1,2}}
  %d = f32[1,96,2,64,1]{4,3,2,1,0} collective-permute-done(%s)
}
"""
    found = hlo.collectives(text, 8)["collective-permute"]
    assert found.count == 1 and found.bytes == found.traffic_bytes == 96 * 2 * 64 * 4


def test_a_windowed_matmuls_unsigned_trip_count_counts():
    """XLA's windowed matmul (a weight gathered piece by piece, FSDP-style) counts its
    trips in u32, as the TPU compiler writes it: each trip's dot counts."""
    text = """HloModule m

%body (p: (bf16[4,8], u32[])) -> (bf16[4,8], u32[]) {
  %x = bf16[4,8]{1,0} parameter(0)
  %w = bf16[8,2]{1,0} parameter(1)
  %d = bf16[4,2]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%cond (p: (bf16[4,8], u32[])) -> pred[] {
  %c = u32[]{:T(128)} constant(8)
  %i = u32[]{:T(128)} get-tuple-element(%p), index=1
  ROOT %lt = pred[]{:T(512)} compare(%i, %c), direction=LT
}

ENTRY %main (a: bf16[4,8]) -> bf16[4,8] {
  %w = (bf16[4,8], u32[]) while(%t), condition=%cond, body=%body
}
"""
    # the 7 trips after the first: the dot's 2 x 4 x 2 x 8, and the condition's compare
    assert hlo.repeated_flops(text) == 7 * (2 * 4 * 2 * 8 + 1)


def test_a_loop_whose_counter_steps_by_two_runs_half_its_bound():
    """The TPU compiler's two-way windowed matmul runs two dots a trip and adds 2 to its
    counter: below 8, that is 4 trips, not 8 (each dot counted once, not twice)."""
    text = """HloModule m

%body (p: (bf16[4,8], u32[])) -> (bf16[4,8], u32[]) {
  %p = (bf16[4,8], u32[]) parameter(0)
  %x = bf16[4,8]{1,0} get-tuple-element(%p), index=0
  %w = bf16[8,2]{1,0} constant({...})
  %d = bf16[4,2]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %e = bf16[4,2]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %i = u32[]{:T(128)} get-tuple-element(%p), index=1
  %two.sunk = u32[]{:T(128)} constant(2)
  %next = u32[]{:T(128)} add(%i, %two.sunk)
  ROOT %out = (bf16[4,8]{1,0}, u32[]{:T(128)}) tuple(%x, /*index=1*/%next)
}

%cond (p: (bf16[4,8], u32[])) -> pred[] {
  %c = u32[]{:T(128)} constant(8)
  %p = (bf16[4,8], u32[]) parameter(0)
  %i = u32[]{:T(128)} get-tuple-element(%p), index=1
  ROOT %lt = pred[]{:T(512)} compare(%i, %c), direction=LT
}

ENTRY %main (a: bf16[4,8]) -> bf16[4,8] {
  %w = (bf16[4,8], u32[]) while(%t), condition=%cond, body=%body
}
"""
    # the 3 trips after the first: two dots of 2 x 4 x 2 x 8, the counter's add and the
    # condition's compare
    assert hlo.repeated_flops(text) == 3 * (2 * (2 * 4 * 2 * 8) + 1 + 1)
    # the counter copied before the add, as the compiler writes some of them
    copied = text.replace("%next = u32[]{:T(128)} add(%i, %two.sunk)",
                          "%j = u32[]{:T(128)S(6)} copy(%i)\n"
                          "  %next = u32[]{:T(128)} add(%j, %two.sunk)")
    assert "copy(%i)" in copied and hlo.repeated_flops(copied) == hlo.repeated_flops(text)


def test_the_compilers_cycle_estimates_are_charged_by_kind_for_every_trip():
    """Each instruction's ``estimated_cycles`` (a TPU compile's backend config), a loop
    body's once per trip; a fusion charged as the operation it is built around, an
    instruction without an estimate (a copy started and awaited) not at all."""
    text = """HloModule m, is_scheduled=true

%fused_conv (p0: bf16[8,16]) -> f32[8,16] {
  %p0 = bf16[8,16]{1,0} parameter(0)
  %pad.1 = bf16[10,16]{1,0} pad(%p0, %z), padding=1_1x0_0
  ROOT %convolution.1 = f32[8,16]{1,0} convolution(%pad.1, %w), window={size=3}
}

%fused_add (p0: f32[8,16]) -> f32[8,16] {
  ROOT %add.1 = f32[8,16]{1,0} add(%p0, %p0)
}

%body (p: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %fusion.2 = f32[8,16]{1,0} fusion(%x), kind=kLoop, calls=%fused_add, backend_config={"estimated_cycles":"100"}
}

%cond (p: (s32[], f32[8,16])) -> pred[] {
  %c = s32[] constant(5)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

ENTRY %main (a: bf16[8,16]) -> f32[8,16] {
  %fusion.1 = f32[8,16]{1,0} fusion(%a), kind=kOutput, calls=%fused_conv, metadata={op_name="jit(call_torch)/aten::convolution/conv_general_dilated"}, backend_config={"estimated_cycles":"700"}
  %copy.1 = f32[8,16]{0,1} copy(%fusion.1), backend_config={"estimated_cycles":"40"}
  %copy-start.1 = (f32[8,16]{0,1}, f32[8,16]{0,1}, u32[]) copy-start(%copy.1)
  %w = (s32[], f32[8,16]) while(%t), condition=%cond, body=%body
}
"""
    found = {e.name: e for e in hlo.estimated_cycles(text)}
    assert set(found) == {"fusion.1", "copy.1", "fusion.2"}
    assert (found["fusion.1"].kind, found["fusion.1"].cycles) == ("convolution", 700)
    assert found["fusion.1"].source.endswith("aten::convolution/conv_general_dilated")
    assert (found["copy.1"].kind, found["copy.1"].cycles) == ("layout copy", 40)
    assert (found["fusion.2"].kind, found["fusion.2"].cycles) == ("elementwise", 500)
    assert hlo.estimated_cycles("HloModule m\n") == []
