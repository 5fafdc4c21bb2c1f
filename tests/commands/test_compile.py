"""porter compile: the whole run compiled for a TPU slice, what fits and what does not,
programs compiled again by themselves, a decoder per tile."""

import json

import pytest

from porter import registry as registry_mod, recipe
from porter.aot import hlo, programs, targets

from support import RECIPES
from support.aot import needs_libtpu
from support.processes import porter_calls, user_porter


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


def test_a_whole_videos_bound_counts_each_stage_and_says_what_it_leaves_out():
    from porter.aot import roofline

    def row(stage, calls, bound):
        return {"stage": stage, "calls": calls, "call_bound_s": bound}

    step = {"bound_s": 0.5}
    whole = roofline.video([row("encode", 2, 0.1), row("denoise", 50, 0.5),
                            row("decode", 1, 3.0)], 50, step)
    assert whole == {"bound_s": pytest.approx(0.2 + 25 + 3), "steps": 50, "missing": [],
                     "stages_s": {"encode": pytest.approx(0.2), "denoise": 25,
                                  "decode": 3.0}, "frames": None, "chunked": False,
                     "eager": []}
    # a stage with a component left eager (an image encoder whose recipe turns its
    # compile off, beside its VAE's compiled encode) is not counted as whole
    assert roofline.video([row("encode", 2, 0.1), row("denoise", 50, 0.5)], 50, step,
                          eager=("encode",))["missing"] == ["decode", "encode"]
    # a streamed decode (its programs in the order a run calls them): the first frames
    # after the first chunk's call, then the decode's rate
    streamed = roofline.video([row("encode", 2, 0.1), row("decode", 1, 0.5),
                               row("decode", 20, 0.25)], 50, step, frames=81)
    assert streamed["stream"] == {"first_frames_s": pytest.approx(0.2 + 25 + 0.5),
                                  "frames_per_second": pytest.approx(81 / 5.5)}
    # a pipeline that makes its video chunk by chunk (4 chunks, each its steps then its
    # decode; the first chunk 4 calls, the others 2 each): the first frames after the
    # first chunk, then the later chunks' rate, over the frames the pipeline made
    calls = [row("encode", 2, 0.1), {**row("denoise", 10, 0.5), "first_chunk": 4},
             {**row("decode", 4, 0.5), "frames": 129}]
    chunked = roofline.video(calls, None, step, frames=132, chunked=True)
    assert chunked["frames"] == 129 and chunked["stages_s"]["denoise"] == 5
    assert chunked["stream"] == {"first_frames_s": pytest.approx(0.2 + 2 + 0.5),
                                 "frames_per_second": pytest.approx(129 / 4 / 1.5),
                                 "chunks": 4, "first_chunk_s": pytest.approx(2.5),
                                 "chunk_s": pytest.approx(1.5)}
    # a pipeline that decodes chunk by chunk where it can, decoded once (its VAE tiles
    # the size): a whole decode's stream
    once = roofline.video(calls[:2] + [{**row("decode", 1, 0.5), "frames": 129}], None,
                          step, frames=132, chunked=True)
    assert not once["chunked"] and "chunks" not in once["stream"]
    # where the order is not known: equal shares
    even = roofline.video(calls[:1] + [row("denoise", 10, 0.5)] + calls[2:], None, step,
                          frames=132, chunked=True)
    assert even["stream"]["first_chunk_s"] == even["stream"]["chunk_s"] == \
        pytest.approx(7.0 / 4)
    # a decode that did not compile, and no encode program (an eager text encoder)
    partial = roofline.video([{"stage": "decode", "calls": 1}], 50, step)
    assert partial["missing"] == ["decode", "encode"] and partial["bound_s"] == 25
    assert roofline.video([], 50, None) is None


def test_a_step_shared_by_two_experts_counts_both_halves():
    """A dry run's calls a step are averages: two transformers that share the steps
    (each half of them) add up to one call a step; the families' own programs (one call
    a step each, the experts taking turns) count the busiest."""
    import types

    from porter.aot import roofline
    from porter.aot.programs import Program

    def compiled(component, per_step):
        return types.SimpleNamespace(
            program=Program(component, stage="denoise", per_step=per_step),
            memory={"temp": 1}, flops=1e12, bytes_accessed=1e9, collectives={},
            matmul_flops={"bf16": 1e12})

    v6e = targets.named("v6e-8")
    one = roofline.step([compiled("transformer", 1)], v6e)
    shared = roofline.step([compiled("transformer", 0.5), compiled("transformer_2", 0.5)], v6e)
    turns = roofline.step([compiled("transformer", 1), compiled("transformer_2", 1)], v6e)
    assert shared["bound_s"] == pytest.approx(one["bound_s"])
    assert shared["component"] == "transformer + transformer_2"
    assert turns["bound_s"] == pytest.approx(one["bound_s"])


@needs_libtpu
def test_tiny_wan_compiled_for_v5e_holds_the_plans_weights(tmp_path):
    """In a fresh process, as a user runs it (then `porter plan` in the same one):
    every program compiled by the TPU compiler; each chip holds the weights `porter
    plan` puts on it, and the weights a compiled program takes per chip are its
    component's share of them."""
    tiny = str(RECIPES / "wan-tiny-tp.yaml")
    (tmp_path / "hlo").mkdir()
    (tmp_path / "hlo" / "99-vae.decode_chunk.hlo").write_text("an earlier compile's")
    (tmp_path / "hlo" / "notes.txt").write_text("the user's")
    out, planned_out = porter_calls(
        ["compile", tiny, "--target", "v5e-8", "--json", "--hlo", tmp_path / "hlo"],
        ["plan", tiny, "--devices", "8", "--json"])
    assert out.returncode == 0, out.stderr
    # each program's optimized HLO kept, with the compiler's estimate of its cycles;
    # an earlier compile's files replaced, nothing else touched
    kept = sorted(p.name for p in (tmp_path / "hlo").iterdir() if p.suffix == ".hlo")
    assert (tmp_path / "hlo" / "notes.txt").exists()
    assert "99-vae.decode_chunk.hlo" not in kept
    assert kept[:2] == ["01-text_encoder.forward.hlo", "02-transformer.forward.hlo"]
    assert kept[2:] and all(name.endswith("-vae.decode_chunk.hlo") for name in kept[2:])
    decode = hlo.estimated_cycles((tmp_path / "hlo" / kept[-1]).read_text())
    assert any(e.kind == "convolution" and e.cycles > 0 for e in decode)
    assert "internal error" not in out.stderr and "E0000" not in out.stderr
    report = json.loads(out.stdout)
    plan = json.loads(planned_out.stdout)
    assert report["weights_per_chip"]["total"] == plan["weights_bytes_per_device"]
    planned = {c["component"]: c["bytes_per_device"] for c in plan["components"]}
    assert report["weights_per_chip"]["components"] == planned
    rows = {row["program"]: row for row in report["programs"]}
    assert set(rows) == {"text_encoder.forward", "transformer.forward", "vae.decode_chunk"}
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
    # the whole video: the text encoder's calls, every step, the decode, at their bounds
    whole = report["video"]
    assert whole["missing"] == [] and whole["steps"] == 4
    assert whole["stages_s"]["denoise"] == pytest.approx(report["roofline"]["bound_s"] * 4)
    encoder = rows["text_encoder.forward"]
    assert whole["stages_s"]["encode"] == pytest.approx(encoder["call_bound_s"]
                                                        * encoder["calls"])
    assert whole["bound_s"] == pytest.approx(sum(whole["stages_s"].values()))
    # what `porter compile` prints without --json: the same report, rendered
    from porter.aot import roofline
    from porter.commands.compile import render

    assert "a whole video, a lower bound" in render(report)
    # beside a published whole video (as MaxDiffusion's sit beside Wan 14B's compile):
    # the bound taken to the published step count

    anchor = roofline.Anchor("x", "v5e-8", 64, 64, 17, 0.5, "25 s for 50 steps", "url",
                             steps=50)
    report["anchors"] = [roofline.implied(report["roofline"], anchor, None)]
    assert report["anchors"][0]["video_s"] == 25.0
    at = roofline.video_at(whole, report["roofline"], 50)
    assert at == pytest.approx(whole["bound_s"] + 46 * report["roofline"]["bound_s"])
    assert f"published whole video: 25 s for 50 steps (25 s for 50 steps): " \
        f"{25 / at:.1f}x the bound for those steps" in render(report)


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

    from porter.aot.executable import Compiled
    from porter.aot.programs import Program
    from porter.commands import compile as report_mod

    program = Program("transformer", "forward", (), {}, calls=1, per_step=1)
    row = report_mod._program_row(Compiled(program, refused="INTERNAL: Mosaic failed to "
                                           "compile TPU kernel: Invalid vector type for "
                                           "load"), 2**30,
                                  types.SimpleNamespace(usable_hbm_bytes=2**34))
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
    assert "transformer.forward does not fit a v5e-8 device" in out.stderr
    assert "15.75 GiB are available" in out.stderr
    assert "attention.backend: auto (splash on TPU)" in out.stderr
    assert "RESOURCE_EXHAUSTED" in out.stdout  # the compiler's own words, in the report


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
    decoder calls (4 latent tile shapes, 16 calls), each fitting a v5e chip. (That a
    submodule compiled by itself computes what its whole component does is held for
    Wan's transformer blocks, tests/transforms/jit/test_jit.py; this decoder's tiles
    against its whole tiled decode are no longer run here: 30-40 s of the suite.)"""
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
        port.generate()
    finally:
        handle.remove()
    ran = programs.unique(calls)
    assert len(ran) == 4 and sum(p.calls for p in ran) == 16

    loaded = recipe.load(RECIPES / "hunyuan-tiny.yaml", [*TILED, BY_TILE])
    compiled = report.build(loaded, registry_mod.loaded(), "v5e-8", only=["vae.decoder"])
    rows = compiled["programs"]
    assert sorted((row["inputs"]["arg0"], row["calls"]) for row in rows) == sorted(
        (f"float32{list(p.args[0].shape)}", p.calls) for p in ran)
    assert all(row["program"] == "vae.decoder" and row["fits"] for row in rows)
    assert compiled["verdict"]["fits"] is True


@needs_libtpu
def test_a_tpu_decode_is_split_over_the_mesh_by_default():
    """The tiny Wan VAE (no activation rule in the recipe) compiled for v5e-8: its maps'
    width split over the 8 chips (``sharding.vae_split``), the halos passed between
    neighbours (collective-permute); each chip computes a fraction of the decode the
    recipe's empty rule list keeps on one chip (over the streamed decode's three
    programs, each times its calls: 124 against 849 MFLOP at 32 latent columns, 4 a
    chip). Both run the decoder in row blocks (a TPU's; ``porter.families.row_blocks``),
    the causal cache too, each call's cache on the chips as the call before returned it.
    Their bounds differ 3.5 times (0.83 against 2.93 ms): each chip still reads all the
    VAE's weights and gathers the middle block's frames, which weigh at this size."""
    command = ["compile", RECIPES / "wan-tiny-tp.yaml", "--target", "v5e-8",
               "--program", "vae.decode_chunk", "--json", "generate.width=256"]
    reports = []
    for out in porter_calls(command, [*command, "sharding.activations.vae=[]"]):
        assert out.returncode == 0, out.stderr
        rows = json.loads(out.stdout)["programs"]
        # the first latent frame, the second, then the three after them: one program
        assert [row["calls"] for row in rows] == [1, 1, 3]
        assert all(row["status"] == "compiled" and row["fits"] for row in rows)
        reports.append(rows)

    def total(rows, key):
        return sum(row[key] * row["calls"] for row in rows)

    split, whole = reports
    assert all("collective-permute" in row["collectives"] for row in split)
    assert not any(row["collectives"] for row in whole)
    # the cache of the last latent frames: 8 row blocks of the whole image's 8 rows
    for rows in (split, whole):
        assert rows[2]["inputs"]["arg1"][0] == "float32[8, 16, 2, 1, 32]"
        # a chip's inputs: at most the call before's outputs (its cache and pixels as it
        # left them), the weights and the latent frame (a whole cache is 8 shares)
        for before, after in zip(rows, rows[1:]):
            assert after["memory"]["argument"] <= (before["memory"]["output"]
                                                   + rows[0]["memory"]["argument"])
    assert total(split, "flops") <= total(whole, "flops") / 4
    assert total(split, "call_bound_s") <= total(whole, "call_bound_s") / 3


def test_a_folder_for_the_hlo_that_cannot_be_written_is_refused_before_compiling(tmp_path):
    (tmp_path / "a-file").write_text("")
    tiny = str(RECIPES / "wan-tiny-tp.yaml")
    out = user_porter("compile", tiny, "--target", "v5e-8", "--hlo", tmp_path / "a-file" / "x")
    assert out.returncode == 2 and "a-file is a file, not a directory" in out.stderr
    out = user_porter("compile", tiny, "--target", "v5e-8", "--choose-mesh", "--hlo", tmp_path)
    assert out.returncode == 2 and "--hlo keeps the programs of one compile" in out.stderr
    assert "building the port" not in out.stderr
    # a compile refused before its programs are known leaves no folder behind
    out = user_porter("compile", tiny, "--target", "v5e-8", "generate.stepz=2",
                      "--hlo", tmp_path / "new")
    assert out.returncode == 2 and "stepz" in out.stderr
    assert not (tmp_path / "new").exists()
