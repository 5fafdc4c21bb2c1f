"""Compiled for the real target: each family's declared programs are what its runs call,
and `porter compile` has libtpu's TPU compiler compile them with no TPU and no weights.

The tests that compile for a TPU need libtpu (``pip install 'porter[tpu]'``, as the
quick start and CI install it) and skip, saying so, where it is absent.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from porter import plugins, recipe
from porter.aot import hlo, programs, targets
from porter.errors import UsageError

from conftest import RECIPES

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="compiling for a TPU needs libtpu: "
                                         "pip install 'porter[tpu]'")
IMAGE = str(RECIPES / "assets" / "first_frame.png")
LAST = str(RECIPES / "assets" / "last_frame.png")


def user_porter(*args, timeout=600):
    """The porter command as a user's shell runs it: a new process, nothing imported,
    no JAX settings in the environment (the tests' own are removed)."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    return subprocess.run([sys.executable, "-m", "porter.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


# ---------------------------------------------------------------- declared programs

RUNS = [
    ("wan-tiny.yaml", []),
    ("wan-tiny.yaml", ["generate.guidance_scale=1.0"]),
    ("wan-tiny-tp.yaml", []),
    ("wan-tiny-tp.yaml", ["mesh={dp: 1, tp: 8}", "generate.cfg_parallel=false"]),
    ("wan22-i2v-tiny.yaml", []),
    ("wan22-ti2v-tiny.yaml", []),
    ("wan-flf2v-tiny.yaml", []),
    ("cogvideox-tiny.yaml", []),
    ("cogvideox-tiny.yaml", ["model.variant=v1.5"]),
    ("cogvideox-tiny.yaml", ["model.variant=v1-i2v", f"generate.image={IMAGE}"]),
    ("hunyuan-tiny.yaml", []),
    ("hunyuan15-tiny.yaml", []),
    ("hunyuan15-tiny.yaml", ["generate.cfg_parallel=true", "mesh.dp=2"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,overrides", RUNS, ids=lambda v: v if isinstance(v, str)
                         else " ".join(v))
def test_declared_programs_are_what_a_run_calls(name, overrides):
    """What `porter compile` compiles, at a recipe's shapes, is each compiled call of a
    real run of the same recipe: component, method, every input's shape and dtype on
    the device, the static arguments, and how many calls."""
    import porter
    from porter.loading import abstract
    from porter.transforms import compile as compile_transform

    port = porter.load(RECIPES / name, *overrides, "generate.steps=3")
    rules = compile_transform.rules(port.recipe, port.family, "cpu")
    with programs.recorded(port.pipe, rules) as calls:
        port.generate()
    ran = programs.unique(calls)
    declared = programs.unique(port.family.programs(
        port.recipe, abstract.components(port.family, port.recipe)))
    assert [(p.signature(), p.calls) for p in declared] == \
        [(p.signature(), p.calls) for p in ran]
    assert ran  # every family here compiles something


def test_program_signatures_tell_inputs_apart():
    a = programs.Program("vae", "decode", (programs.Input((1, 4), torch.float32),))
    b = programs.Program("vae", "decode", (programs.Input((1, 4), torch.bfloat16),))
    merged = programs.unique([a, a, b])
    assert [p.calls for p in merged] == [2, 1]


# ---------------------------------------------------------------- targets

def test_targets_as_tpu_users_name_them():
    assert targets.named("v5litepod-8") is targets.named("v5e-8")
    for name, chips in (("v4-8", 4), ("v5e-8", 8), ("v5p-8", 4), ("v6e-8", 8),
                        ("v5e-16", 16), ("v6e-16", 16)):
        target = targets.named(name)
        assert target.chips == chips and target.facts.source.startswith("https://")
    with pytest.raises(UsageError, match="unknown target 'v6e-9'") as refused:
        targets.named("v6e-9")
    assert "did you mean 'v6e-8'" in refused.value.hint


def test_without_libtpu_compile_says_what_to_install(monkeypatch):
    from porter.errors import UsageError

    monkeypatch.setattr(targets, "libtpu_missing", lambda: "libtpu is not installed")
    with pytest.raises(UsageError) as info:
        targets.devices(targets.named("v6e-8"))
    assert "pip install 'porter[tpu]'" in info.value.hint


def test_programs_compiled_again_by_themselves_replace_their_stage():
    """Programs compiled by themselves (--program) take the place of their stage's
    programs (a decode's tile programs for the decode in one): their peaks count every
    weight of the recipe, and the verdict follows them both ways."""
    from porter.commands.compile import replace_programs

    GiB = 2**30
    usable = targets.named("v6e-8").facts.usable_hbm_bytes

    def row(program, stage, peak, weights, seconds):
        return {"program": program, "component": program.split(".")[0], "stage": stage,
                "status": "compiled", "trace_s": 1.0, "compile_s": seconds,
                "weights_bytes_per_chip": weights, "program_peak_bytes": peak,
                "peak_bytes_per_chip": 10 * GiB - weights + peak,
                "fits": 10 * GiB - weights + peak <= usable, "inputs": {}}

    report = {"target": {"name": "v6e-8", "usable_hbm_bytes": usable},
              "weights_per_chip": {"total": 10 * GiB}, "attention_backend": "auto",
              "not_compiled": {"vae": "not asked for (--program)"},
              "programs": [row("transformer.forward", "denoise", 12 * GiB, 8 * GiB, 200.0),
                           row("vae.decode", "decode", 30 * GiB, GiB, 1000.0),
                           row("vae._encode", "encode", 2 * GiB, GiB, 50.0)]}
    report["verdict"] = {"fits": False}
    tiles = [row("vae.decoder", "decode", 4 * GiB, GiB, 400.0),
             row("vae.decoder", "decode", 3 * GiB, GiB, 300.0)]
    for tile in tiles:
        tile["peak_bytes_per_chip"] = None  # computed from this report's weights
    replaced = replace_programs(report, tiles)
    assert [(r["program"], r["peak_bytes_per_chip"]) for r in replaced["programs"]] == [
        ("transformer.forward", 14 * GiB), ("vae.decoder", 13 * GiB),
        ("vae.decoder", 12 * GiB), ("vae._encode", 11 * GiB)]
    assert replaced["verdict"]["fits"] is True
    assert replaced["verdict"]["peak_bytes_per_chip"] == 14 * GiB
    assert replaced["compile_s"] == 201 + 401 + 301 + 51
    assert replaced["not_compiled"] == {}
    assert report["programs"][1]["program_peak_bytes"] == 30 * GiB  # a copy, not changed
    bigger = replace_programs(replaced, [row("vae.decode", "decode", 25 * GiB, GiB, 9.0)])
    assert bigger["verdict"]["fits"] is False and bigger["verdict"]["program"] == "vae.decode"
    assert [r["program"] for r in bigger["programs"]] == [
        "transformer.forward", "vae.decode", "vae._encode"]
    with pytest.raises(ValueError, match="denoising program"):
        replace_programs(report, [row("transformer.forward", "denoise", GiB, 8 * GiB, 1.0)])


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


# ---------------------------------------------------------------- compiled for a TPU

@needs_libtpu
def test_tiny_wan_compiled_for_v5e_holds_the_plans_weights(tmp_path):
    """In a fresh process, as a user runs it: every program compiled by the TPU
    compiler; each chip holds the weights `porter plan` puts on it, and the weights a
    compiled program takes per chip are its component's share of them."""
    tiny = str(RECIPES / "wan-tiny-tp.yaml")
    out = user_porter("compile", tiny, "--target", "v5e-8", "--json")
    assert out.returncode == 0, out.stderr
    assert "internal error" not in out.stderr and "E0000" not in out.stderr
    report = json.loads(out.stdout)
    plan = json.loads(user_porter("plan", tiny, "--devices", "8", "--json").stdout)
    assert report["weights_per_chip"]["total"] == plan["weights_bytes_per_device"]
    planned = {c["component"]: c["bytes_per_device"] for c in plan["components"]}
    assert report["weights_per_chip"]["components"] == planned
    rows = {row["program"]: row for row in report["programs"]}
    assert set(rows) == {"text_encoder.forward", "transformer.forward", "vae.decode"}
    for row in rows.values():
        assert row["status"] == "compiled" and row["fits"]
        # the compiler's own arguments hold the program's weights (padded to its tiles)
        assert row["memory"]["argument"] >= row["weights_bytes_per_chip"]
        assert row["weights_bytes_per_chip"] == planned[row["component"]]
    transformer = rows["transformer.forward"]
    assert transformer["scanned_blocks"] == {"blocks": 2}
    assert transformer["calls"] == 4 and transformer["flops"] > 0
    assert "all-gather" in transformer["collectives"]  # weights split over tp
    assert report["verdict"]["fits"] is True and report["roofline"]["bound_s"] > 0


@needs_libtpu
def test_a_one_device_image_encoder_compiles_with_torchaxs_attention(monkeypatch, capsys):
    """Wan's CLIP image encoder has no sharding rule: it runs on one device, where the
    TPU's attention kernel, sharded over the whole mesh, cannot take its inputs. It runs
    with torchax's attention (in a run too), and compiles: the real recipe's encoder
    (its published configuration; about 20 s)."""
    from porter import cli
    from porter.transforms import attention

    args = ["compile", str(RECIPES / "wan-i2v-14b.yaml"), "--target", "v6e-8",
            "--program", "image_encoder.forward", "--json"]
    assert cli.main(args) == 0
    [row] = [r for r in json.loads(capsys.readouterr().out)["programs"]
             if r["status"] == "compiled"]
    assert row["program"] == "image_encoder.forward" and row["fits"]
    # the recipe's attention in a one-device component: what failed before
    monkeypatch.setattr(attention, "skipped", lambda b: list(b.recipe.attention.skip))
    assert cli.main(args) == 2
    assert "Received incompatible devices" in capsys.readouterr().err


@needs_libtpu
def test_float16_attention_compiles_as_a_mosaic_kernel_for_tpu():
    """Mosaic has no float16 vector loads ("Invalid vector type for load"): splash
    computes float16 attention in float32 inside the kernel, so a float16 recipe
    (CogVideoX-2b's) compiles for a TPU."""
    out = user_porter("compile", str(RECIPES / "wan-tiny-tp.yaml"), "--target", "v6e-8",
                      "--program", "transformer.forward", "model.dtype=float16",
                      "attention.backend=auto", "--json")
    assert out.returncode == 0, out.stderr
    [row] = json.loads(out.stdout)["programs"]
    assert row["status"] == "compiled" and row["fits"]


def test_a_program_the_compiler_cannot_build_is_not_called_out_of_memory():
    """A refusal that is not the compiler's out-of-memory (a kernel it cannot build)
    says the program cannot be compiled, and what to change; "does not fit" is kept
    for memory (the float16 kernel above was reported as not fitting)."""
    import types

    from porter.commands import compile as report_mod
    from porter.aot.compiler import Compiled
    from porter.aot.programs import Program

    program = Program("transformer", "forward", (), {}, calls=1, per_step=1)
    row = report_mod._program_row(Compiled(program, refused="INTERNAL: Mosaic failed to "
                                           "compile TPU kernel: Invalid vector type for "
                                           "load"), 2**30, 2**34)
    assert row["status"] == "not compiled" and "fits" not in row
    report = {"programs": [row], "target": {"name": "v6e-8"},
              "weights_per_chip": {"total": 2**30}, "not_compiled": {}}
    verdict = report_mod._verdict(report, types.SimpleNamespace(usable_hbm_bytes=2**34))
    assert verdict["fits"] is None
    assert verdict["message"].startswith("transformer.forward cannot be compiled for v6e-8")
    assert "attention.backend blockwise" in verdict["hint"]


@needs_libtpu
def test_a_program_that_cannot_fit_is_refused_with_the_compilers_numbers():
    """One 14B-wide Wan block at 480p with attention that materialises every score:
    the TPU compiler refuses it; exit 2 names the program, what it needs and what the
    chip has, and what to change, not a traceback."""
    config = ("model.config={num_layers: 1, num_attention_heads: 40, attention_head_dim: "
              "128, ffn_dim: 13824, text_dim: 4096, rope_max_seq_len: 1024}")
    out = user_porter("compile", str(RECIPES / "wan-tiny-tp.yaml"), "--target", "v5e-8",
                      "--program", "transformer.forward", config, "generate.height=480",
                      "generate.width=832", "generate.frames=81", "sharding.weights={}",
                      "attention.backend=reference")
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr
    assert "transformer.forward does not fit a v5e-8 chip" in out.stderr
    assert "15.75 GiB are available" in out.stderr
    assert "attention.backend: auto (splash on TPU)" in out.stderr
    assert "RESOURCE_EXHAUSTED" in out.stdout  # the compiler's own words, in the report


@needs_libtpu
def test_splash_compiles_as_a_mosaic_kernel_at_a_real_length():
    """Wan 14B's 720p attention (75,600 tokens, 40 heads of 128), batch 2 on dp, heads on
    tp: on a CPU host, compiled for a TPU target, splash is Mosaic's custom call, not the
    interpreted kernel, and its FLOPs (out of XLA's sight) are counted while tracing."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    from porter.transforms import attention

    mesh = targets.mesh(targets.named("v6e-8"), {"dp": 2, "tp": 4})
    shape = (2, 40, 75600, 128)
    spec = jax.ShapeDtypeStruct(shape, jnp.bfloat16,
                                sharding=NamedSharding(mesh, P("dp", "tp")))
    config = dict(registry={b.name: b for b in attention.BUILTIN}, block_q=1024,
                  block_kv=1024, data_axis="dp", head_axis="tp")
    with attention.counted() as flops:
        lowered = jax.jit(lambda q, k, v: attention.attend(
            q, k, v, backend="auto", mesh=mesh, config=config, platform="tpu")).lower(
                spec, spec, spec)
    compiled = lowered.compile()
    assert hlo.opaque_kernels(compiled.as_text()) >= 1
    assert compiled.memory_analysis().temp_size_in_bytes < 2**30
    assert flops == [4 * 2 * 40 * 75600 * 75600 * 128 / 8]


@needs_libtpu
def test_rotary_writes_compile_to_little_tpu_code():
    """Wan's rotary writes q and k through strided slices (``out[..., 0::2] = ...``),
    which core.setitem turns into pads and a select: at the 1.3B's 480p length, sharded
    as the recipe shards it, the TPU program is about 1 MiB of code (with interior
    padding it was 85 MiB and took two minutes to compile; a 30-block transformer held
    one per block and write)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

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
    from porter.aot import compiler, port as abstract_port

    results = {}
    for scan in (True, False):
        loaded = recipe.load(RECIPES / "wan-tiny-tp.yaml",
                             [f"compile={{transformer: {{scan: {str(scan).lower()}}}}}"])
        built = abstract_port.build(loaded, plugins.registry(), targets.named("v5e-8"))
        program = next(p for p in built.family.programs(
            loaded, {n: c.module for n, c in built.components.items()})
            if p.component == "transformer")
        results[scan] = compiler.compile_program(built, program)
    assert results[True].scanned == {"blocks": 2} and not results[False].scanned
    assert results[True].flops == pytest.approx(results[False].flops, rel=0.02)
    # bytes: a bound, at least the weights (a scan reads one block's slice per trip)
    assert results[True].bytes_accessed >= results[True].weights_bytes


@needs_libtpu
def test_a_mesh_larger_than_the_target_is_refused():
    out = user_porter("compile", str(RECIPES / "wan14b.yaml"), "--target", "v5p-8")
    assert out.returncode == 2
    assert "needs 8 devices but v5p-8 has 4 chips" in out.stderr


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


TILED = ["generate.height=32", "generate.width=32", "generate.steps=2",
         "setup={vae: [{name: enable_tiling, params: {tile_sample_min_height: 16, "
         "tile_sample_min_width: 16, tile_sample_stride_height: 8, "
         "tile_sample_stride_width: 8}}]}"]
BY_TILE = "compile={vae: {methods: [decode], modules: decoder}}"


@needs_libtpu
@pytest.mark.slow
def test_a_decoder_compiled_by_itself_is_compiled_per_tile_as_the_run_calls_it():
    """`compile.vae.modules: decoder` with tiling: diffusers' tile loop runs eagerly and
    each tile's decoder call is a compiled program. `porter compile` finds those calls
    by running the loop on shapes alone: the same tile shapes and counts as a run's
    decoder calls (4 latent tile shapes, 16 calls), and the run's frames are those of
    the run that compiles the whole tiled decode as one program."""
    import numpy as np

    import porter
    from porter.commands import compile as report

    port = porter.load(RECIPES / "hunyuan-tiny.yaml", *TILED, BY_TILE)
    vae = port.pipe.vae
    decoder = getattr(vae, "module", vae).decoder
    calls = []
    handle = decoder.register_forward_pre_hook(
        lambda _m, args: calls.append(programs.Program("vae", "decoder",
                                                       programs.described(args))))
    try:
        tiled = port.generate()
    finally:
        handle.remove()
    ran = programs.unique(calls)
    assert len(ran) == 4 and sum(p.calls for p in ran) == 16

    loaded = recipe.load(RECIPES / "hunyuan-tiny.yaml", [*TILED, BY_TILE])
    compiled = report.build(loaded, plugins.registry(), "v5e-8", only=["vae.decoder"])
    rows = compiled["programs"]
    assert sorted((row["inputs"]["arg0"], row["calls"]) for row in rows) == sorted(
        (f"float32{list(p.args[0].shape)}", p.calls) for p in ran)
    assert all(row["program"] == "vae.decoder" and row["fits"] for row in rows)
    assert compiled["verdict"]["fits"] is True

    whole = porter.load(RECIPES / "hunyuan-tiny.yaml", *TILED).generate()
    assert np.array_equal(tiled.frames, whole.frames)


def test_submodule_calls_are_found_from_shapes_alone():
    """A compiled submodule's calls, found by running the code around it on the meta
    device: one program per input shape, counted; code that needs values raises."""
    class Tiles(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(4, 4)

        def decode(self, x):  # 3 tiles of 4 rows, then the 2 left over
            return torch.cat([self.inner(x[i:i + 4]) for i in range(0, x.shape[0], 4)])

        def forward(self, x):
            return self.inner(x) if bool((x > 0).all()) else x

    with torch.device("meta"):  # as porter compile builds components: no values
        model = Tiles()
    found = programs.submodule_calls(model, "inner", programs.Program(
        "vae", "decode", (programs.Input((14, 4), torch.float32),), calls=2))
    assert sorted((p.args[0].shape, p.calls, p.name) for p in programs.unique(found)) == [
        ((2, 4), 2, "vae.inner"), ((4, 4), 6, "vae.inner")]
    with pytest.raises(Exception):
        programs.submodule_calls(model, "inner", programs.Program(
            "vae", "forward", (programs.Input((14, 4), torch.float32),)))
