"""Programs compiled by libtpu's TPU compiler with no TPU: splash as a Mosaic kernel,
rotary writes in little code, real-width blocks, a scan's costs as the unrolled blocks'."""

import json

import pytest

from porter import registry as registry_mod, recipe
from porter.aot import hlo, targets

from support import RECIPES
from support.aot import needs_libtpu
from support.attention import WAN14B_720P, compiled_wan14b_720p
from support.processes import user_porter


@needs_libtpu
def test_splash_compiles_as_a_mosaic_kernel_at_a_real_length():
    """Wan 14B's 720p attention (75,600 tokens, 40 heads of 128), batch 2 on dp, heads on
    tp: on a CPU host, compiled for a TPU target, splash is Mosaic's custom call, not the
    interpreted kernel, and its FLOPs (out of XLA's sight) are counted while tracing."""
    compiled, flops = compiled_wan14b_720p("v6e-8")
    assert hlo.opaque_kernels(compiled.as_text()) >= 1
    assert compiled.memory_analysis().temp_size_in_bytes < 2**30
    assert flops == [4 * 2 * 40 * 75600 * 75600 * 128 / 8]


@needs_libtpu
def test_a_window_compiles_as_splash_with_its_block_mask_at_a_real_length():
    """Wan 14B's 720p self-attention windowed (tiles of 3 x 16 x 16 tokens, each seeing
    its neighbours and the first frames): splash as Mosaic's custom call, and the FLOPs
    counted are the blocks its mask keeps, under a third of dense attention's."""
    from types import SimpleNamespace

    from porter.transforms.attention import window

    section = SimpleNamespace(tile=[3, 16, 16], reach=[1, 1, 1], global_frames=3)
    compiled, flops = compiled_wan14b_720p("v6e-8", window=section)
    assert hlo.opaque_kernels(compiled.as_text()) >= 1
    tiling = window.Tiling((21, 45, 80), (3, 16, 16), (1, 1, 1), 3)
    assert flops == [window.kernel_flops(tiling, WAN14B_720P, "splash") / 8]
    dense = 4 * 2 * 40 * 75600 * 75600 * 128
    assert 0.30 < flops[0] * 8 / dense < 0.33  # 28% of the tiles, padded 45 -> 48 rows


@needs_libtpu
@pytest.mark.parametrize("axes, token_axes", [({"dp": 2, "tp": 4}, ()),
                                              ({"dp": 2, "ring": 4}, ("ring",))])
def test_a_splash_call_nothing_splits_compiles_whole_on_each_chip(axes, token_axes):
    """Another component's attention through the recipe's backend (a text encoder's 77
    tokens of 3 heads, batch 1) divides neither dp, tp nor the ring: splash runs whole
    on each chip, where the bare kernel stopped the compile at "Mosaic kernels cannot
    be automatically partitioned"."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from porter.transforms.attention import kernels, sharded

    mesh = targets.mesh(targets.named("v6e-8"), axes)
    shape = jax.ShapeDtypeStruct((1, 3, 77, 64), jnp.bfloat16,
                                 sharding=NamedSharding(mesh, P()))

    def attend(q, k, v):
        return sharded.run(kernels.splash, mesh, q, k, v, None, data_axis="dp",
                           head_axis="tp", token_axes=token_axes, mosaic=True,
                           scale=0.125, block_q=128, block_kv=128, platform="tpu")

    compiled = jax.jit(attend).lower(shape, shape, shape).compile()
    assert hlo.opaque_kernels(compiled.as_text()) == 1


@needs_libtpu
def test_rotary_writes_compile_to_little_tpu_code():
    """Wan's rotary writes q and k through strided slices (``out[..., 0::2] = ...``),
    which core.setitem turns into pads and a select: at the 1.3B's 480p length, sharded
    as the recipe shards it, the TPU program is about 1 MiB of code (with interior
    padding it was 85 MiB and took two minutes to compile; a 30-block transformer held
    one per block and write)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from porter.shims.setitem import strided_set

    def rotate(x, cos, sin):
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = strided_set(jnp.zeros_like(x), (Ellipsis, slice(0, None, 2)), x1 * cos - x2 * sin)
        return strided_set(out, (Ellipsis, slice(1, None, 2)), x1 * sin + x2 * cos)

    mesh = targets.mesh(targets.named("v6e-8"), {"dp": 2, "tp": 4})
    x = jax.ShapeDtypeStruct((2, 32760, 12, 128), jnp.bfloat16,
                             sharding=NamedSharding(mesh, P("dp", None, "tp")))
    table = jax.ShapeDtypeStruct((1, 32760, 1, 64), jnp.float32,
                                 sharding=NamedSharding(mesh, P()))
    compiled = jax.jit(rotate).lower(x, table, table).compile()
    assert compiled.memory_analysis().generated_code_size_in_bytes < 8 * 2**20


@needs_libtpu
def test_two_real_width_wan_blocks_compile_for_v6e(tmp_path):
    """Two Wan 14B blocks (widths as published) at 480p, sharded as wan-base.yaml shards
    them, compiled for a v6e-8: the transformer's figures the benchmark table reports
    (weights per chip as planned, FLOPs against the analytic count, collectives)."""
    config = ("model.config={num_layers: 2, num_attention_heads: 40, attention_head_dim: "
              "128, ffn_dim: 13824, text_dim: 4096, rope_max_seq_len: 1024}")
    base = RECIPES / "wan-base.yaml"
    shards = json.dumps(recipe.load(base).resolved()["sharding"]["weights"]["transformer"])
    out = user_porter("compile", str(RECIPES / "wan-tiny-tp.yaml"), "--target", "v6e-8",
                      "--program", "transformer.forward", "--json", config,
                      "generate.height=480", "generate.width=832", "generate.frames=81",
                      "generate.max_sequence_length=512", f"sharding.weights={{transformer: "
                      f"{shards}}}", "attention={backend: auto, block_q: 1024, block_kv: "
                      "1024, data_axis: dp, head_axis: tp}", "model.dtype=bfloat16")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    row = report["programs"][0]
    assert row["fits"] and row["scanned_blocks"] == {"blocks": 2}
    # two blocks' FLOPs per chip for both guidance passes: the analytic count, within 10%
    tokens, width, ffn, text = 21 * 30 * 52, 5120, 13824, 512
    per_block = (8 * tokens * width ** 2 + 4 * tokens ** 2 * width + 4 * tokens * width ** 2
                 + 4 * text * width ** 2 + 4 * tokens * text * width
                 + 4 * tokens * width * ffn)
    assert row["flops"] == pytest.approx(2 * 2 * per_block / 8, rel=0.1)
    assert row["collectives"]["all-reduce"]["count"] >= 6  # Megatron: per attention, FFN
    assert report["weights_per_chip"]["components"]["transformer"] == \
        row["weights_bytes_per_chip"]


@needs_libtpu
def test_scanned_costs_equal_the_unrolled_ones():
    """The compiler counts a loop's body once: a scanned program's FLOPs, completed by
    the matmuls of the loop's further trips, equal the unrolled program's."""
    from porter.aot import executable
    from porter.aot import port as abstract_port

    results = {}
    for scan in (True, False):
        loaded = recipe.load(RECIPES / "wan-tiny-tp.yaml",
                             [f"compile={{transformer: {{scan: {str(scan).lower()}}}}}"])
        built = abstract_port.build(loaded, registry_mod.loaded(), targets.named("v5e-8"))
        program = next(p for p in built.family.programs(
            loaded, {n: c.module for n, c in built.components.items()})
            if p.component == "transformer")
        results[scan] = executable.compile_program(built, program)
    assert results[True].scanned == {"blocks": 2} and not results[False].scanned
    assert results[True].flops == pytest.approx(results[False].flops, rel=0.02)
    # bytes: a bound, at least the weights (a scan reads one block's slice per trip)
    assert results[True].bytes_accessed >= results[True].weights_bytes


@needs_libtpu
@pytest.mark.parametrize("target,fmt", [("v6e-8", "int8"), ("v7x-8", "fp8")])
def test_8bit_matmuls_stay_8bit_in_the_compiled_program_and_count_at_their_peak(target,
                                                                              fmt):
    """The compiler keeps the quantized layers' dots on 8-bit operands (v6e: int8,
    TPU7x: fp8), the same matmul FLOPs as the unquantized program, and the step's
    compute bound counts them at the chip's 8-bit peak."""
    from porter.aot import executable, roofline
    from porter.aot import port as abstract_port

    found = {}
    for quantized in (None, fmt):
        loaded = recipe.load(RECIPES / "wan-tiny-tp.yaml",
                             [f"quantize.format={quantized or 'null'}"])
        built = abstract_port.build(loaded, registry_mod.loaded(), targets.named(target))
        program = next(p for p in built.family.programs(
            loaded, {n: c.module for n, c in built.components.items()})
            if p.component == "transformer")
        found[quantized] = executable.compile_program(built, program)
    plain, low = found[None].matmul_flops, found[fmt].matmul_flops
    assert fmt not in plain and low[fmt] > 0.3 * sum(low.values())
    # the same matmuls, to within the few small dots XLA rewrites otherwise in one of
    # the two programs (2.2% of this tiny model's, 27,648 FLOPs of 1.26 million)
    assert sum(low.values()) == pytest.approx(sum(plain.values()), rel=0.05)
    chip = targets.named(target).facts
    assert roofline.compute_seconds(found[fmt].flops, low, chip) == pytest.approx(
        low[fmt] / (2 * chip.peak_bf16_flops)
        + (found[fmt].flops - low[fmt]) / chip.peak_bf16_flops)


@pytest.mark.slow
def test_scan_equals_blocks_one_by_one():
    """A transformer whose blocks run as one scan gives the latents of the same port with
    its blocks traced one by one (float32, sharded dp=2 x tp=4)."""
    import porter

    latents = []
    for scan in ("true", "false"):
        port = porter.load(RECIPES / "wan-tiny-tp.yaml", f"compile={{transformer: "
                           f"{{scan: {scan}}}}}", "generate.steps=3")
        latents.append(port.generate().latents)
    scale = latents[1].abs().max()
    assert (latents[0] - latents[1]).abs().max() / scale <= 1e-5


@pytest.mark.parametrize("stage", ["tracing", "compiling"])
def test_a_kill_while_compiling_stops_the_command_not_reported_as_a_refusal(monkeypatch,
                                                                           stage):
    """SIGTERM raises ``Interrupted`` (porter.runtime.interrupt): while a program is
    traced or compiled it ends ``porter compile`` (exit 128 + 15), where it was taken
    for the compiler refusing the program and the next program compiled."""
    import signal
    from types import SimpleNamespace

    from porter.aot import executable
    from porter.errors import Interrupted

    def stopped(*_):
        raise Interrupted(signal.SIGTERM)

    lowered = SimpleNamespace(compile=stopped)
    monkeypatch.setattr(executable, "_lower", stopped if stage == "tracing"
                        else lambda *_: (lowered, []))
    port = SimpleNamespace(components={"vae": SimpleNamespace(weights_bytes_per_chip=0)})
    with pytest.raises(Interrupted):
        executable.compile_program(port, executable.Program("vae", "decode", {}))


def test_a_compiled_call_places_the_familys_inputs_as_a_run_does(tmp_path):
    """`porter compile` gives a program's keyword inputs the run's placement: the
    family's default (FAR's cache, its heads over the head axis) under the recipe's
    own `sharding.inputs`, everything else replicated; a component on one device
    takes everything there."""
    from types import SimpleNamespace

    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

    from porter.aot import executable
    from porter.aot.programs import Program

    mesh = Mesh(np.array(jax.devices()[:2]), ("tp",))
    registry = registry_mod.loaded()
    (tmp_path / "r.yaml").write_text(
        "model: {family: generic, source: unused, pipeline: AnyFlowFARPipeline}\n"
        "generate: {prompt: a cat}\nmesh: {tp: 2}\nattention: {head_axis: tp}\n")

    def shardings(*overrides, one_device=False):
        made = recipe.load(tmp_path / "r.yaml", list(overrides))
        port = SimpleNamespace(recipe=made, family=registry.family("generic"),
                               runtime=SimpleNamespace(mesh=mesh, axes={"tp": 2}))
        component = SimpleNamespace(
            one_device=one_device, module=SimpleNamespace(
                config=SimpleNamespace(num_attention_heads=2)))
        program = Program("transformer", "far_step")
        return executable._input_shardings(port, component, program)

    heads = NamedSharding(mesh, PartitionSpec(None, None, None, "tp", None, None))
    found = shardings()
    assert found.get(("kwargs", "context")) == heads == found.get(("kwargs", "window"))
    assert found.get(("kwargs", "hidden_states")) == NamedSharding(mesh, PartitionSpec())
    found = shardings('sharding.inputs={"window": [null]}')
    assert found.get(("kwargs", "context")) == heads
    assert found.get(("kwargs", "window")) == NamedSharding(mesh, PartitionSpec(None))
    assert isinstance(shardings(one_device=True).get(("kwargs", "context")),
                      SingleDeviceSharding)
