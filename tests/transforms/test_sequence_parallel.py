"""A transformer's tokens split over the mesh's sequence axis ``sp`` (sequence
parallelism): the default rule on the family's token blocks, attention exchanging
tokens for heads around its kernel, what validate refuses, what plan counts, and the
run equal to the one-device run."""

import json

import numpy as np
import pytest

import porter
from porter import recipe, registry as registry_mod
from porter.port import estimates
from porter.transforms import sharding

from support import RECIPES
from support.processes import user_porter
from support.runs import final_latents, relative

TINY = RECIPES / "wan-tiny.yaml"
SP = RECIPES / "wan-tiny-sp.yaml"


def wan():
    return registry_mod.loaded().family("wan")


def test_the_tokens_of_every_stepped_transformer_go_over_sp():
    loaded = recipe.load(SP)
    [rule] = sharding.sequence_split(loaded, wan(), {"dp": 2, "sp": 4})
    # the batch where the recipe's inputs put it, the tokens over sp, the width whole
    assert rule.module == wan().token_blocks and rule.spec == ["dp", "sp", None]
    [rule] = sharding.sequence_split(recipe.load(TINY), wan(), {"sp": 8})
    assert rule.spec == [None, "sp", None]
    assert sharding.sequence_split(loaded, wan(), {"dp": 2, "sp": 1}) == []
    generic = registry_mod.loaded().family("generic")
    assert sharding.sequence_split(loaded, generic, {"sp": 8}) == []  # says no blocks
    rt = type("Runtime", (), {"axes": {"dp": 2, "sp": 4}, "platform": "tpu"})
    for name in ("transformer", "transformer_2"):  # both of Wan 2.2's experts
        assert sharding.activation_rules(loaded, name, None, rt, wan()) == [rule.model_copy(
            update={"spec": ["dp", "sp", None]})]
    # a recipe's own rules (an empty list too) replace the default
    own = recipe.load(SP, ["sharding.activations={transformer: []}"])
    assert sharding.activation_rules(own, "transformer", None, rt, wan()) == []


def test_validate_refuses_another_head_axis_and_no_token_blocks():
    for mesh in ("{dp: 2, sp: 2, tp: 2}", "{dp: 2, sp: auto, tp: 2}"):  # 'auto' counts
        problems = sharding.sequence_problems(
            recipe.load(SP, [f"mesh={mesh}", "attention.head_axis=tp"]), wan())
        assert [p.path for p in problems] == ["attention.head_axis"]
        assert "exchanges them for heads on that axis" in problems[0].message
    # beside sp each device windows its own heads (every token of them)
    windowed = recipe.load(SP, ["attention.window={tile: [1, 2, 2], reach: [1, 1, 1]}"])
    assert sharding.sequence_problems(windowed, wan()) == []
    # a Mosaic kernel on a TPU mesh: the heads' axis is sp, said or not
    from porter.transforms import attention
    splash = recipe.load(SP, ["attention.backend=splash", "attention.data_axis=null"])
    assert attention.platform_problems(splash, registry_mod.loaded(), "tpu") == []
    # round a ring every call runs the kernel on its own share of the queries
    splash = recipe.load(SP, ["attention.backend=splash", "attention.data_axis=null",
                              "mesh={dp: 1, ring: 8}"])
    assert attention.platform_problems(splash, registry_mod.loaded(), "tpu") == []
    generic = registry_mod.loaded().family("generic")
    [problem] = sharding.sequence_problems(recipe.load(SP), generic)
    assert problem.path == "mesh.sp" and "sharding.activations.transformer" in problem.hint
    ruled = recipe.load(SP, ["sharding.activations={transformer: "
                             "[{module: 'blocks\\.\\d+', spec: [null, sp, null]}]}"])
    assert sharding.sequence_problems(ruled, generic) == []
    assert sharding.sequence_problems(recipe.load(TINY), wan()) == []  # no sp
    # over a ring axis the heads may go over tp (no exchange of tokens for heads there)
    ring = recipe.load(TINY, ["mesh={ring: 4, tp: 2}", "attention.head_axis=tp"])
    assert sharding.sequence_problems(ring, wan()) == []
    # the window round a ring: each ring device windows its share of the query tiles
    windowed = recipe.load(TINY, ["mesh={ring: 8}",
                                  "attention.window={tile: [1, 2, 2], reach: [1, 1, 1]}"])
    assert sharding.sequence_problems(windowed, wan()) == []
    [problem] = sharding.sequence_problems(
        recipe.load(TINY, ["mesh={ring: 8}", "attention.head_axis=ring"]), wan())
    assert problem.path == "attention.head_axis" and "tokens, not heads" in problem.message
    # the tiny video's 80 tokens over ring=2 x sp=4 divide; over ring=3 x sp=4 they do not
    assert sharding.token_problems(recipe.load(TINY), 80, {"ring": 2, "sp": 4}) == []
    [problem] = sharding.token_problems(recipe.load(TINY), 80, {"ring": 3, "sp": 4})
    assert problem.path == "mesh.ring" and "80 tokens do not divide over ring=3 x sp=4" \
        in problem.message


def test_plan_counts_each_device_its_own_tokens():
    raw = {"tokens": 80, "flops_per_step": 8,
           "activations": {"hidden": (2, 80, 24), "ffn": (2, 80, 48)},
           "attention": {"self": (2, 2, 80, 80)}}
    split = estimates.costs(recipe.load(SP), raw, {"dp": 2, "sp": 4})
    whole = estimates.costs(recipe.load(SP), raw, {"dp": 2, "sp": 1})
    for name in ("hidden", "ffn"):
        assert split["activations"][name]["bytes_per_device"] * 4 == \
            whole["activations"][name]["bytes_per_device"]
    # the heads over sp around the kernel
    assert split["attention"]["self"]["reference_bytes_per_device"] * 4 == \
        whole["attention"]["self"]["reference_bytes_per_device"]
    # what a device sends a layer: 2 heads on 4 devices go round the ring (its key and
    # value shares, 3 hops); 4 heads are exchanged (4 tensors, 3/4 of each share sent)
    share = 1 * 80 * 24 * 4 // 4  # a (batch, tokens, width) tensor's on one device
    assert split["exchange"] == {"kind": "ring", "bytes_per_layer_and_device": 2 * share * 3,
                                 "bytes_per_step_and_device": None}
    four = {**raw, "attention": {"self": (2, 4, 80, 80)}, "layers": 3, "calls_per_step": 2}

    def exchange(**axes):
        return estimates.costs(recipe.load(SP), four, axes)["exchange"]

    assert exchange(dp=2, sp=4) == {"kind": "all-to-all",
                                    "bytes_per_layer_and_device": 3 * share,
                                    "bytes_per_step_and_device": 3 * share * 3 * 2}
    # 2-D: the heads over sp=2, the ring over ring=2 (a quarter of the tokens a device)
    assert exchange(dp=2, ring=2, sp=2)["kind"] == "all-to-all and ring"
    assert exchange(dp=2, ring=2, sp=2)["bytes_per_layer_and_device"] == 4 * share // 2 \
        + 2 * share
    # the queries over a ring hold a part of the scores each; heads over tp beside it
    # pass a part of each share
    ringed = estimates.costs(recipe.load(SP), four, {"dp": 2, "ring": 4})
    assert ringed["attention"]["self"]["reference_bytes_per_device"] * 4 == \
        estimates.costs(recipe.load(SP), four, {"dp": 2})["attention"]["self"][
            "reference_bytes_per_device"]
    beside_tp = estimates.costs(recipe.load(SP, ["attention.head_axis=tp"]), four,
                                {"ring": 4, "tp": 2})["exchange"]
    assert beside_tp["bytes_per_layer_and_device"] == 2 * (2 * share // 2) * 3
    assert "exchange" not in whole
    # a window round the ring gathers the heads' keys and values; without the token
    # grid it counts the queries and output gathered too (4 tensors to the other device)
    window = recipe.load(SP, ["attention.window={tile: [2, 2, 2], reach: [1, 1, 1]}"])
    gathered = estimates.costs(window, four, {"dp": 2, "ring": 2, "sp": 2})["exchange"]
    assert gathered["kind"] == "all-to-all and all-gather"
    assert gathered["bytes_per_layer_and_device"] == 4 * share // 2 + 4 * share
    # with it, the rows of the tiles that straddle the two (frame 3's first two rows: 8
    # of a device's 40 tokens, there and back) are all the queries and output move
    routed = estimates.costs(window, {**four, "grid": (5, 4, 4)}, {"dp": 2, "ring": 2,
                                                                  "sp": 2})["exchange"]
    assert routed["bytes_per_layer_and_device"] == 4 * share // 2 + 2 * share \
        + 2 * share // 5
    assert routed["kind"] == "all-to-all and all-gather and collective-permute"


def frames(path, *overrides):
    port = porter.load(path, *overrides)
    with port:
        result = port.generate()
    return result.frames, result.record


@pytest.mark.slow
def test_tokens_over_8_devices_equal_one_device():
    one, _ = frames(TINY, "mesh={dp: 1}", "attention.backend=blockwise")
    # every device a share of the tokens (the tiny model's 2 heads divide no sp here:
    # ring attention); the guidance batch over dp beside them
    for path, overrides, axes in (
            (TINY, ["mesh={sp: 8}", "attention.backend=blockwise"], ["sp"]),
            (SP, [], ["dp", "sp"]),
            # the blocks as one scan: the rule holds inside its body
            (SP, ["compile={transformer: {methods: [forward], scan: true}}"], ["dp", "sp"])):
        split, record = frames(path, *overrides)
        assert np.abs(split.astype(int) - one.astype(int)).max() <= 1
        assert record["weights"]["components"]["transformer"]["default_split"] == axes


@pytest.mark.slow
def test_heads_exchanged_for_tokens_equal_one_device():
    """8 heads over sp=8: each device attends with one head over every token (the
    all-to-all exchange, Ulysses), equal to one device: the final latents, in float32,
    to 1e-5 of their largest (measured 8e-7; the frames of the whole split are
    test_tokens_over_8_devices_equal_one_device's)."""
    heads = ["model.config.num_attention_heads=8", "attention.backend=blockwise"]
    one = final_latents(TINY, "mesh={dp: 1}", *heads)
    dense = one
    # Ulysses; the same heads round a ring axis; and in 2-D: heads over sp, the ring
    # over ring (measured 8e-7, 9e-7, 8e-7)
    for mesh in ("mesh={sp: 8}", "mesh={ring: 8}", "mesh={ring: 2, sp: 4}"):
        assert relative(final_latents(TINY, mesh, *heads), one) <= 1e-5, mesh
    # 8-bit weights and matmuls, and a step cache (TaylorSeer: a fixed schedule of
    # computed and predicted steps), beside the 2-D split; the window beside it (each
    # device windows its heads over every token, the ring's devices a query tile in two).
    # 8-bit over two steps: at four, this random model's video hangs on single int8
    # roundings that any reordered float sum may flip (one device's own 'reference' and
    # 'blockwise' attention make videos 48 levels apart at four steps, 1 at two).
    # Bounds ten times the differences measured (1.2e-4, 3.8e-5, 9e-7)
    window = "attention.window={tile: [1, 2, 2], reach: [1, 1, 0], global_frames: 1, " \
             "dense_steps: 1}"
    for extra, bound in (
            (["quantize.format=int8", "generate.steps=2"], 1e-3),
            (["cache={method: taylorseer, cache_interval: 2, disable_cache_before_step: 1}",
              "generate.steps=6"], 5e-4),
            ([window], 1e-5)):
        one = final_latents(TINY, "mesh={dp: 1}", *heads, *extra)
        split = final_latents(TINY, "mesh={ring: 2, sp: 4}", *heads, *extra)
        assert relative(split, one) <= bound, extra
    assert relative(split, dense) > 1e-3  # the window ran (measured 1.2e-2)


GENERIC = """\
model: {family: generic, source: %s, pipeline: WanPipeline}
generate: {prompt: a cat, height: 64, width: 64, frames: 9, steps: 2, guidance_scale: 6.0,
           max_sequence_length: 16}
attention: {backend: blockwise}
sharding:
  activations:   # the recipe says which tensors are the tokens: each block's output
    transformer: [{module: 'blocks\\.\\d+', spec: [null, sp, null]}]
"""


@pytest.mark.slow
def test_a_generic_pipeline_with_its_tokens_over_sp_equals_one_device(tmp_path):
    """Diffusers' WanPipeline run by its own loop (``family: generic``), its tokens over
    sp=8 by the recipe's own rule (2 heads: the ring), equal to one device."""
    from models.wan_t2v import build_wan_t2v_pipeline

    build_wan_t2v_pipeline().save_pretrained(tmp_path / "wan")
    (tmp_path / "r.yaml").write_text(GENERIC % (tmp_path / "wan"))
    one, _ = frames(tmp_path / "r.yaml", "mesh={dp: 1}", "sharding.activations={}")
    split, _ = frames(tmp_path / "r.yaml", "mesh={sp: 8}")
    assert np.abs(split.astype(int) - one.astype(int)).max() <= 1


@pytest.mark.slow
def test_a_tpu_step_exchanges_tokens_for_heads():
    """The tiny Wan transformer with 8 heads compiled for v5e-8, its tokens over sp:
    all-to-alls around attention (Ulysses), no all-reduce of activations (the weights
    are whole on every chip), and each chip an eighth of the FLOPs."""
    def step(*extra):
        out = user_porter("compile", str(SP), "--target", "v5e-8", "--program",
                          "transformer.forward", "--json", "model.config.num_attention_heads=8",
                          "mesh={dp: 1, sp: 8}", "generate.cfg_parallel=false",
                          "sharding.inputs={}", "attention.data_axis=null",
                          "generate.width=256", *extra)
        assert out.returncode == 0, out.stderr
        [row] = json.loads(out.stdout)["programs"]
        assert row["status"] == "compiled"
        return row

    split, whole = step(), step("mesh={dp: 1, sp: 1}")
    assert "all-to-all" in split["collectives"]
    assert split["collectives"].get("all-reduce", {}).get("bytes", 0) < 2**20
    assert split["flops"] <= whole["flops"] / 6
    # round a ring axis: the key/value shares passed on, nothing exchanged nor gathered,
    # each share through splash (Mosaic's kernel, no heads' axis needed round a ring)
    ring = step("mesh={dp: 1, ring: 8}", "attention.backend=splash")
    assert "collective-permute" in ring["collectives"]
    assert "all-to-all" not in ring["collectives"]
    assert ring["collectives"].get("all-gather", {}).get("bytes", 0) < 2**20
    assert ring["flops"] <= whole["flops"] / 6


@pytest.mark.slow
def test_cogvideox_tokens_over_sp_equal_one_device():
    """CogVideoX's blocks return (video tokens, text tokens); its attention runs over
    both, joined: the default split holds the video's, and the run equals one device."""
    path = RECIPES / "cogvideox-tiny.yaml"
    one, _ = frames(path, "mesh={dp: 1}", "attention.backend=blockwise")
    split, record = frames(path, "mesh={sp: 8}", "attention.backend=blockwise")
    assert np.abs(split.astype(int) - one.astype(int)).max() <= 1
    assert record["weights"]["components"]["transformer"]["default_split"] == ["sp"]
