"""A generic or modular pipeline declares no programs: ``porter compile`` finds them by
running the pipeline's own call on abstract components (``porter.aot.dry_run``). What
it finds is what a real run of the same recipe calls: component, method, every input's
shape and dtype, the static arguments, how many calls."""

import json

import pytest

import porter
from porter.errors import UsageError
from porter import registry as registry_mod, recipe
from porter.aot import dry_run, programs, targets
from porter.aot import port as abstract_port
from porter.families import row_blocks, wan_vae
from porter.shims.interop import unwrapped
from porter.transforms import jit

from models.anyflow_far import build_anyflow_far_pipeline
from models.helios import build_helios_pipeline
from models.ltx import build_ltx_pipeline
from models.minimax_h3 import build_minimax_h3_pipeline
from models.skyreels_v2_df import build_skyreels_v2_df_pipeline
from models.wan_animate2 import build_wan_animate2_pipeline
from models.wan_t2v import build_wan_t2v_pipeline
from support.aot import needs_libtpu
from support.processes import user_porter

LTX = """\
model: {{family: generic, source: {source}, pipeline: LTXPipeline}}
generate: {{prompt: "a cat", height: 32, width: 32, frames: 9, steps: 2, guidance_scale: 3.0,
           max_sequence_length: 16}}
compile:
  transformer:
    methods: [forward]
    static_argnames: [return_dict, num_frames, height, width, rope_interpolation_scale]
  vae: {{methods: [decode]}}
"""
WAN_MODULAR = """\
model: {{family: generic, source: {source}, pipeline: WanModularPipeline}}
generate: {{prompt: "a cat", height: 16, width: 16, frames: 9, steps: 2, guidance_scale: 6.0,
           max_sequence_length: 16}}
"""
# a character image animated by a driving video: the VAE encodes (its compiled _encode,
# which encode wraps), the transformer reads its reference grid's sizes with .item()
# and attends through flex attention with a block mask
WAN_ANIMATE2 = """\
model: {{family: generic, source: {source}, pipeline: WanAnimate2ModularPipeline}}
generate: {{prompt: "a cat", image: {inputs}/image.png, video: {inputs}/video, height: 32,
           width: 32, steps: 2, max_sequence_length: 16, extra: {{segment_frame_length: 5}}}}
"""
# video with sound; the text encoder is entered through its .model child, and the
# schedule counts its final sigma as a step (3 steps: two transformer calls)
MINIMAX_H3 = """\
model: {{family: generic, source: {source}, pipeline: MiniMaxH3ModularPipeline}}
generate: {{prompt: "a cat", height: 32, width: 32, frames: 124, steps: 3}}
"""
# an autoregressive pipeline: two chunks of two latent frames, each denoised then
# decoded; its transformer turns autocast off on its inputs' device (meta, here)
HELIOS = """\
model: {{family: generic, source: {source}, pipeline: HeliosPipeline}}
generate: {{prompt: "a cat", height: 16, width: 16, frames: 10, steps: 2,
           guidance_scale: 1.0, max_sequence_length: 16,
           extra: {{num_latent_frames_per_chunk: 2}}}}
"""
# a long video in windows of 3 latent frames overlapping by 2, decoded whole at its end,
# but window by window where the run takes its frames as they come (its stream): a
# decode program a latent frame until the VAE's causal cache settles
SKYREELS_DF = """\
model: {{family: generic, source: {source}, pipeline: SkyReelsV2DiffusionForcingPipeline}}
generate: {{prompt: "a cat", height: 16, width: 16, frames: 17, steps: 2,
           guidance_scale: 6.0, max_sequence_length: 16,
           extra: {{base_num_frames: 9, overlap_history: 5}}}}
"""
# frame-autoregressive in 4 chunks of one latent frame, its transformer at fixed shapes
# (porter/families/far.py): two denoising programs (the first chunk's, before any
# cache), three kinds of cache call, each finished chunk decoded as it is cached
ANYFLOW_FAR = """\
model: {{family: generic, source: {source}, pipeline: AnyFlowFARPipeline}}
generate: {{prompt: "a cat", height: 32, width: 32, frames: 13, steps: 2,
           guidance_scale: 6.0, max_sequence_length: 16,
           extra: {{chunk_partition: [1, 1, 1, 1]}}}}
"""
#: builder, recipe, and each compiled component's calls a step in each stage
CASES = {
    # 4 chunks of 2 steps: a denoising call a chunk and step (4 a step), 3 cache calls
    # in 2 steps' worth
    "anyflow-far": (build_anyflow_far_pipeline, ANYFLOW_FAR,
                    {("text_encoder", "encode"): 0, ("transformer", "denoise"): 5.5,
                     ("vae", "decode"): 0}),
    "helios": (build_helios_pipeline, HELIOS,
               {("text_encoder", "encode"): 0, ("transformer", "denoise"): 2,
                ("vae", "decode"): 0}),
    "ltx": (build_ltx_pipeline, LTX, {("text_encoder", "encode"): 0,
                                      ("transformer", "denoise"): 1, ("vae", "decode"): 0}),
    "wan-modular": (build_wan_t2v_pipeline, WAN_MODULAR,
                    {("text_encoder", "encode"): 0, ("transformer", "denoise"): 2,
                     ("vae", "decode"): 0}),
    # two segments of 5 frames, each a reference pass and two guided calls a step; the
    # character image and the driving video encoded by the VAE's compiled _encode, the
    # character image by the compiled CLIP image encoder too
    "wan-animate2": (build_wan_animate2_pipeline, WAN_ANIMATE2,
                     {("text_encoder", "encode"): 0, ("image_encoder", "encode"): 0,
                      ("transformer", "denoise"): 5, ("vae", "encode"): 0,
                      ("vae", "decode"): 0}),
    # its text encoder's language model called by the pipeline itself: run eagerly
    "minimax-h3": (build_minimax_h3_pipeline, MINIMAX_H3,
                   {("transformer", "denoise"): 2 / 3, ("vae", "decode"): 0}),
    # 6 windows of 2 steps (guided as one batch)
    "skyreels-df": (build_skyreels_v2_df_pipeline, SKYREELS_DF,
                    {("text_encoder", "encode"): 0, ("transformer", "denoise"): 6,
                     ("vae", "decode"): 0}),
}


def _named(signature):
    """A signature with each object that is no value as its class's name: the same in
    two runs (an object the call writes, Wan-Animate-2's key/value cache, is described
    by its slots: ``programs.State``)."""
    if isinstance(signature, (tuple, list)):
        return type(signature)(_named(v) for v in signature)
    if type(signature).__module__.startswith("diffusers"):
        return type(signature).__name__
    return signature


def _inputs(folder):
    """A 9-frame 32x32 driving video (a folder of frames) and its first frame."""
    import numpy as np
    from PIL import Image

    frames = np.random.default_rng(0).integers(0, 256, (9, 32, 32, 3), dtype=np.uint8)
    (folder / "video").mkdir(parents=True)
    for i, frame in enumerate(frames):
        Image.fromarray(frame).save(folder / "video" / f"{i:05d}.png")
    Image.fromarray(frames[0]).save(folder / "image.png")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_calls_found_are_what_a_run_calls(case, tmp_path, write):
    builder, text, stages = CASES[case]
    builder().save_pretrained(str(tmp_path / "ckpt"))
    path = write("r.yaml", text.format(source=tmp_path / "ckpt",
                                       inputs=_inputs(tmp_path / "inputs")))
    loaded = recipe.load(path)
    eager = set()
    found = dry_run.programs(abstract_port.build(loaded, registry_mod.loaded(),
                                                 targets.named("v6e-8")), eager)
    # a compiled component's call that a run makes eagerly: MiniMax-H3's pipeline calls
    # its text encoder's language model itself, so its encode stage is not all counted
    assert eager == ({"encode"} if case == "minimax-h3" else set())
    port = porter.load(path)
    # as a run on the target decodes: Wan's VAE on a TPU in row blocks, which its causal
    # cache (a decode program's argument) keeps too
    if wan_vae.is_wan_vae(port.pipe.vae):
        assert row_blocks.keep_in_blocks(unwrapped(port.pipe.vae))
    with programs.recorded(port.pipe, jit.rules(port.recipe, port.family, "cpu")) as calls:
        port.generate(on_frames=lambda frames: None)  # as a run with its stream
    ran = programs.unique(calls)
    assert [(_named(p.signature()), p.calls) for p in found] == \
        [(_named(p.signature()), p.calls) for p in ran]
    per_stage = {}
    for p in found:  # a component's programs in a stage together (their calls a step)
        per_stage[p.component, p.stage] = per_stage.get((p.component, p.stage), 0) \
            + p.per_step
    assert per_stage == pytest.approx(stages)


def test_a_pipeline_without_its_files_is_refused(write):
    loaded = recipe.load(write("r.yaml", WAN_MODULAR.format(source="someone/some-model")))
    port = type("Port", (), {"recipe": loaded, "family": None, "components": {}})
    with pytest.raises(UsageError, match="without its files"):
        dry_run.programs(port)


def test_small_integers_keep_their_values_through_the_meta_run():
    """A grid's sizes, read with .item() or .tolist() inside a model run on shapes: what
    is computed from known values alone is known, in-place changes included, and the
    pipeline's own tensor is never touched."""
    import torch

    from porter.aot.dry_run import _Known, _meta

    known, host = _Known(guess=False), torch.tensor([[2, 3, 4]])
    grid = _meta(host, known)
    with known:
        assert grid.device.type == "meta" and grid[0][2].item() == 4
        grid[0, 1] = 7
        grid.add_(1)
        assert grid.tolist() == [[3, 8, 5]]
        assert (grid + 1)[0][0].item() == 4
        assert torch.stack([torch.tensor((5, 6, 7))]).tolist() == [[5, 6, 7]]
        with pytest.raises(RuntimeError):  # data, not sizes: no value on the meta device
            torch.empty(3, device="meta").sum().item()
    assert host.tolist() == [[2, 3, 4]]


@needs_libtpu
@pytest.mark.slow
def test_diffusion_forcing_is_bounded_as_its_stream_decodes_it(tmp_path):
    """SkyReels-V2's diffusion forcing decodes each window's finished latent frames
    where the run streams: compiled so, one program a latent frame until the VAE's
    cache settles, the same programs for a longer video; without the stream, whole.
    One compile gives the bound; the longer and the whole video's programs are what
    the compile would find, the dry run's."""
    build_skyreels_v2_df_pipeline().save_pretrained(tmp_path / "df")
    (tmp_path / "r.yaml").write_text(SKYREELS_DF.format(source=tmp_path / "df"))
    done = user_porter("compile", str(tmp_path / "r.yaml"), "--target", "v6e-1", "--json",
                       "generate.frames=17")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    short = [(r["program"], r["calls"]) for r in report["programs"]]
    assert short == [("text_encoder.forward", 2), ("transformer.forward", 12),
                     ("vae.decode_chunk", 1), ("vae.decode_chunk", 1),
                     ("vae.decode_chunk", 3)]
    video = report["video"]
    assert video["chunked"] and video["stream"]["chunks"] == 5  # a latent frame each

    def found(*overrides):
        loaded = recipe.load(tmp_path / "r.yaml", overrides)
        port = abstract_port.build(loaded, registry_mod.loaded(), targets.named("v6e-1"))
        return [(p.name, p.calls) for p in dry_run.programs(port)]

    assert found("generate.frames=17") == short  # the dry run finds what was compiled
    long = found("generate.frames=25")
    assert [name for name, _ in long] == [name for name, _ in short]
    # 7 latent frames, a decode each: the first, the second, then the five after them
    assert long[2:] == [("vae.decode_chunk", 1), ("vae.decode_chunk", 1),
                        ("vae.decode_chunk", 5)]
    assert found("generate.frames=17", "output.stream=false") == [
        ("text_encoder.forward", 2), ("transformer.forward", 12), ("vae.decode", 1)]


@needs_libtpu
@pytest.mark.slow
def test_an_autoregressive_pipeline_is_bounded_chunk_by_chunk(tmp_path):
    """Helios makes its video in chunks, each denoised then decoded: one transformer
    program and one decode program serve every chunk, and the stream's bound counts
    one chunk's work before the first frames."""
    build_helios_pipeline().save_pretrained(tmp_path / "helios")
    (tmp_path / "r.yaml").write_text(
        f"model: {{family: generic, source: {tmp_path / 'helios'}, pipeline: HeliosPipeline}}\n"
        "generate: {prompt: a cat, height: 16, width: 16, frames: 20, steps: 2,\n"
        "           guidance_scale: 1.0, max_sequence_length: 16,\n"
        "           extra: {num_latent_frames_per_chunk: 2}}\n")
    done = user_porter("compile", str(tmp_path / "r.yaml"), "--target", "v6e-1", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    # the prompt encoded once; 4 chunks of 2 steps; the first chunk's 2 calls come
    # before the first decode
    assert [(r["program"], r["calls"], r["first_chunk"]) for r in report["programs"]] == [
        ("text_encoder.forward", 1, 1), ("transformer.forward", 8, 2), ("vae.decode", 4, 0)]
    stream, whole = report["video"]["stream"], report["video"]
    assert stream["chunks"] == 4 and whole["chunked"]
    assert whole["frames"] == 17  # 4 chunks of 5 frames, trimmed to 4n+1
    made = whole["stages_s"]["denoise"] + whole["stages_s"]["decode"]
    assert stream["first_chunk_s"] == pytest.approx(made / 4)  # here the chunks are equal
    assert stream["frames_per_second"] == pytest.approx(17 / made)


@pytest.mark.slow
def test_video_to_videos_input_is_not_counted_as_frames_made(tmp_path):
    """Diffusion forcing's video-to-video hands its input's 7 frames on before any
    decode call: its decode programs make the 17 frames after them, and the stream's
    rate counts those alone."""
    from PIL import Image

    from models.skyreels_v2_df_v2v import build_skyreels_v2_df_v2v_pipeline

    build_skyreels_v2_df_v2v_pipeline().save_pretrained(tmp_path / "v2v")
    (tmp_path / "video").mkdir()
    for index in range(7):
        Image.new("RGB", (16, 16), (index * 30, 0, 0)).save(
            tmp_path / "video" / f"{index:05d}.png")
    path = tmp_path / "r.yaml"
    path.write_text(
        f"model: {{family: generic, source: {tmp_path / 'v2v'},\n"
        "        pipeline: SkyReelsV2DiffusionForcingVideoToVideoPipeline}\n"
        "generate: {prompt: a cat, height: 16, width: 16, frames: 17, steps: 2,\n"
        f"           guidance_scale: 6.0, max_sequence_length: 16, video: {tmp_path / 'video'},\n"
        "           extra: {base_num_frames: 5, overlap_history: 3}}\n")
    found = dry_run.programs(abstract_port.build(recipe.load(path), registry_mod.loaded(),
                                                 targets.named("v6e-1")))
    decodes = [p for p in found if p.stage == "decode"]
    assert len(decodes) > 1 and {p.frames for p in decodes} == {17}
    # without a stream the pipeline decodes the input's latents with the rest: all 24
    [whole] = [p for p in dry_run.programs(abstract_port.build(
        recipe.load(path, ["output.stream=false"]), registry_mod.loaded(),
        targets.named("v6e-1"))) if p.stage == "decode"]
    assert whole.frames == 7 + 17


@needs_libtpu
@pytest.mark.slow
def test_wan_animate2s_transformer_compiles_with_its_cache_and_grid(tmp_path, write):
    """Wan-Animate-2's transformer writes a key/value cache (an object) in each segment's
    reference pass and reads its reference grid with ``.item()``: compiled as a run
    compiles it (``lifting``), the cache's slots in and the written ones out, the grid's
    sizes constants where the call cannot be traced without them. Three programs serve
    both segments: the reference pass, and the guided pair's two calls. Its heads split
    over 4 chips, the steps take the cache as the reference pass left it: split too."""
    from porter.aot import executable
    from porter.aot.programs import State
    from porter.commands import compile as report

    build_wan_animate2_pipeline().save_pretrained(str(tmp_path / "ckpt"))
    path = write("r.yaml", WAN_ANIMATE2.format(source=tmp_path / "ckpt",
                                               inputs=_inputs(tmp_path / "inputs")) + """\
mesh: {tp: 4}
sharding:
  weights:
    transformer:
      - {match: 'blocks\\.\\d+\\.self_attn\\.to_[qkv]\\.weight', spec: [tp, null]}
      - {match: 'blocks\\.\\d+\\.self_attn\\.to_[qkv]\\.bias', spec: [tp]}
      - {match: 'blocks\\.\\d+\\.self_attn\\.norm_[qk]\\.weight', spec: [tp]}
""")
    compiled = report.build(recipe.load(path), registry_mod.loaded(), "v6e-4",
                            only=["transformer.forward"])
    rows = compiled["programs"]
    assert [(r["program"], r["status"], r["calls"]) for r in rows] == [
        ("transformer.forward", "compiled", 2), ("transformer.forward", "compiled", 4),
        ("transformer.forward", "compiled", 4)], [r.get("reason") for r in rows]
    assert all(r["fits"] for r in rows)
    # each call takes the segment's cache: empty in the reference pass, which fills it
    caches = [[v for v in r["inputs"].values() if isinstance(v, dict) and "object" in v]
              for r in rows]
    assert all(len(found) == 1 for found in caches)
    assert caches[0] != caches[1] == caches[2]
    # the grids' sizes, which stay the same in every call; not the steps' timesteps,
    # which change from step to step (data: one program serves every step)
    assert [r["sized"] for r in rows] == [["offset_grid_sizes"], ["reference_grid_sizes"],
                                          ["reference_grid_sizes"]]
    # the slots the reference pass writes come out of its program, beside the video's
    assert rows[0]["memory"]["output"] > rows[1]["memory"]["output"]
    loaded = recipe.load(path)
    port = abstract_port.build(loaded, registry_mod.loaded(), targets.named("v6e-4"))
    found = dry_run.programs(port)
    assert sum(isinstance(v, State) for p in found for v in p.kwargs.values()) == 3
    # the step given the cache replicated holds three quarters of it more on each chip
    # (at least: a TPU's tiles pad a small slot)
    step = [p for p in programs.unique(found) if p.component == "transformer"][1]
    cache = sum(_elements(slot) * slot.dtype.itemsize
                for layer in step.kwargs["kv_cache"].tree["layer_caches"]
                for slot in layer.values())
    replicated = executable.compile_program(port, step).memory["argument"]
    assert replicated - rows[1]["memory"]["argument"] >= cache * 3 // 4


def _elements(leaf) -> int:
    count = 1
    for n in leaf.shape:
        count *= n
    return count
