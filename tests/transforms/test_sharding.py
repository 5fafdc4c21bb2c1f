"""Sharding: rules checked from shapes, bytes per device, and results unchanged."""

import copy

import numpy as np
import pytest
import torch

from porter import registry as registry_mod, recipe, runtime
from porter.commands.validate import validate
from porter.port import active, beside, estimates
from porter.shims.interop import to_device, to_host

from support import RECIPES, TINY_RECIPE
from support.references import diffusers_latents, lowered_text

TP_RECIPE = RECIPES / "wan-tiny-tp.yaml"
F32 = 4


def load_tp(*overrides):
    return recipe.load(TP_RECIPE, list(overrides))


def test_plan_matches_hand_count():
    built = estimates.build(load_tp(), registry_mod.loaded(), devices=8)
    assert built["mesh"] == {"dp": 2, "tp": 4} and built["devices"] == 8
    transformer = next(c for c in built["components"] if c["component"] == "transformer")
    rows = {row["rule"]: row for row in transformer["rules"]}
    # tiny Wan: width 24, FFN 32, 2 blocks, 2 attentions each, float32
    qkv = rows[r"blocks\.\d+\.attn[12]\.to_[qkv]\.weight"]
    assert qkv["tensors"] == 2 * 2 * 3
    assert qkv["bytes"] == 12 * 24 * 24 * F32
    assert qkv["bytes_per_device"] == 12 * 24 * 24 * F32 // 4
    ffn_in = rows[r"blocks\.\d+\.ffn\.net\.0\.proj\.weight"]
    assert ffn_in["bytes"] == 2 * 32 * 24 * F32
    assert ffn_in["bytes_per_device"] == 2 * (32 // 4) * 24 * F32
    unmatched = rows[None]
    from porter_wan.tiny import build_pipeline
    total = sum(t.numel() * F32 for t in build_pipeline().transformer.state_dict().values()) \
        + 2 * 32 * 12 * F32  # the rotary tables are non-persistent buffers
    matched = sum(row["bytes"] for rule, row in rows.items() if rule is not None)
    assert transformer["bytes"] == total
    assert unmatched["bytes"] == total - matched
    assert transformer["bytes_per_device"] == unmatched["bytes"] + sum(
        row["bytes_per_device"] for rule, row in rows.items() if rule is not None)
    assert built["problems"] == []


def test_divisibility_error_names_the_tensor():
    problems = estimates.build(load_tp("mesh.tp=5", "mesh.dp=1", "generate.cfg_parallel=false"),
                          registry_mod.loaded(), devices=5)["problems"]
    text = "\n".join(p.render() for p in problems)
    assert "blocks.0.attn1.to_q.weight shape [24, 24]: dim 0 (24) does not divide by tp=5" \
        in text
    assert "(and 3 more tensors)" in text  # one message per rule, not per block
    assert "axis sizes that divide it: 1, 2, 3, 4" in text
    assert all(p.line for p in problems)  # each points at its rule in the recipe file


def test_rule_typo_unknown_axis_bad_regex(write):
    path = write("r.yaml", TINY_RECIPE + """\
mesh: {dp: 1, tp: 2}
sharding:
  weights:
    transformer:
      - {match: 'blocks\\.\\d+\\.atn1\\.to_q\\.weight', spec: [tp, null]}
      - {match: 'blocks\\.(\\d+\\.attn1', spec: [tp]}
      - {match: 'proj_out\\.weight', spec: [mp, null]}
""")
    loaded = recipe.load(path)
    found = {p.path: p for p in validate(loaded, registry_mod.loaded())}
    assert "invalid regex" in found["sharding.weights.transformer.1.match"].message
    assert "mesh has no axis 'mp'" in found["sharding.weights.transformer.2.spec"].message
    # shape checks wait for a sound recipe; fix the two errors and the typo shows
    fixed = write("fixed.yaml", path.read_text().replace("(\\d", "\\d").replace("mp,", "tp,"))
    found = {p.path: p for p in validate(recipe.load(fixed), registry_mod.loaded())}
    assert "matches no tensor" in found["sharding.weights.transformer.0.match"].message
    assert found["sharding.weights.transformer.0.match"].line == 13


def test_batch_of_one_cannot_split_over_data_axis():
    problems = validate(load_tp("generate.cfg_parallel=false"), registry_mod.loaded())
    [first, *_] = problems
    assert first.path == "sharding.inputs.hidden_states"
    assert "cfg_parallel" in first.hint


def transformer_output(mesh: str, rules_from=None, batch=2, extra=()):
    """The tiny transformer's output with the weights and mesh of a recipe."""
    from porter_wan.tiny import build_pipeline

    overrides = ([f"mesh={mesh}"] if mesh else []) + list(extra)
    loaded = recipe.load(rules_from or RECIPES / "wan-tiny.yaml", overrides)
    rt = runtime.start(loaded)
    pipe = build_pipeline()
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(batch, 16, 3, 4, 4, generator=generator)
    t = torch.tensor([999.0, 250.0][:batch])
    text = torch.randn(batch, 16, 32, generator=generator)
    reference = copy.deepcopy(pipe.transformer)
    calling = beside.ported(pipe, loaded, registry_mod.loaded(), rt)
    with active.transformer_calls(calling), rt.env:
        out = pipe.transformer(hidden_states=to_device(x, rt), timestep=to_device(t, rt),
                               encoder_hidden_states=to_device(text, rt), return_dict=False)[0]
    with torch.no_grad():
        expected = reference(x, t, text, return_dict=False)[0]
    return to_host(out), expected, out


@pytest.mark.parametrize("mesh", ["{dp: 2, tp: 4}", "{dp: 1, tp: 8}", "{dp: 8}"])
def test_sharded_transformer_equals_unsharded(mesh):
    unsharded, expected, _ = transformer_output("{dp: 1}")
    sharded, _, raw = transformer_output(mesh, TP_RECIPE if "tp" in mesh else None)
    assert len(raw.jax().sharding.device_set) == 8
    scale = expected.abs().max()
    assert (sharded - unsharded).abs().max() / scale <= 1e-5
    assert (sharded - expected).abs().max() / scale <= 1e-5


def test_weights_are_placed_by_rule():
    from porter_wan.tiny import build_pipeline

    loaded = load_tp()
    rt = runtime.start(loaded)
    pipe = build_pipeline()
    beside.ported(pipe, loaded, registry_mod.loaded(), rt)
    inner = pipe.transformer.module._model  # ShardedInputs -> JittableModule -> model
    q = inner.blocks[0].attn1.to_q.weight.jax()
    assert q.sharding.spec[0] == "tp"
    assert q.addressable_shards[0].data.shape == (6, 24)
    out = inner.blocks[0].attn1.to_out[0].weight.jax()
    assert out.addressable_shards[0].data.shape == (24, 6)
    assert inner.proj_out.weight.jax().sharding.is_fully_replicated


def test_stacked_blocks_keep_each_blocks_sharding_and_values():
    """Blocks compiled as one scan (porter.transforms.jit.scan): each tensor of the blocks
    stacked on a new leading axis, sharded as the block's tensor was."""
    from porter_wan.tiny import build_pipeline

    loaded = load_tp("compile.transformer.scan=true")
    rt = runtime.start(loaded)
    pipe = build_pipeline()
    expected = [b.attn1.to_q.weight.detach().numpy().copy() for b in pipe.transformer.blocks]
    beside.ported(pipe, loaded, registry_mod.loaded(), rt)
    compiled = pipe.transformer.module  # ShardedInputs -> JittableModule
    q = compiled.params["blocks.*.attn1.to_q.weight"].jax()
    assert tuple(q.sharding.spec)[:2] == (None, "tp")
    assert q.addressable_shards[0].data.shape == (2, 6, 24)
    for index, block in enumerate(expected):
        assert np.array_equal(np.asarray(q[index]), block)
    out = compiled.params["blocks.*.attn1.to_out.0.weight"].jax()
    assert out.addressable_shards[0].data.shape == (2, 24, 6)


@pytest.mark.slow
def test_sharded_cfg_parallel_run_matches_diffusers(tmp_path):
    from porter.commands.run import run

    loaded = load_tp(f"output.dir={tmp_path}", "generate.steps=2")
    result = run(loaded, registry_mod.loaded(), progress=False)
    expected = diffusers_latents(loaded)
    assert result.data["mesh"] == {"dp": 2, "tp": 4}
    assert (result.latents - expected).abs().max() <= 1e-4


@pytest.mark.parametrize("backend", ["blockwise", "splash", "torch-cpu"])
@pytest.mark.parametrize("mesh", ["{dp: 2, tp: 4}", "{dp: 1, tp: 8}"])
def test_replaced_attention_sharded_equals_unsharded(backend, mesh):
    """Regression: a flash kernel plus sharding once changed a Wan port's output.

    The tiny model has 2 heads, so on tp=4 and tp=8 attention runs
    sequence-parallel (queries split, keys and values gathered).
    """
    attention = [f"attention.backend={backend}", "attention.data_axis=dp",
                 "attention.head_axis=tp", "attention.block_q=128", "attention.block_kv=128"]
    unsharded, expected, _ = transformer_output("{dp: 1, tp: 1}", extra=attention)
    sharded, _, raw = transformer_output(mesh, TP_RECIPE, extra=attention)
    assert len(raw.jax().sharding.device_set) == 8
    scale = expected.abs().max()
    assert (unsharded - expected).abs().max() / scale <= 1e-5
    assert (sharded - expected).abs().max() / scale <= 1e-5


def test_activation_constraints_reach_the_compiled_graph(write):
    from porter_wan.tiny import build_pipeline

    def constraints(extra: str) -> str:
        loaded = recipe.load(write("a.yaml", TINY_RECIPE + "mesh: {dp: 2, tp: 4}\n" + extra))
        rt = runtime.start(loaded)
        pipe = build_pipeline()
        beside.ported(pipe, loaded, registry_mod.loaded(), rt)
        x = torch.randn(2, 16, 3, 4, 4)
        return lowered_text(pipe.transformer, rt, hidden_states=to_device(x, rt),
                            timestep=to_device(torch.tensor([9.0, 9.0]), rt),
                            encoder_hidden_states=to_device(torch.randn(2, 16, 32), rt))

    # inputs split over dp in both: a component nothing shards runs on one device
    inputs = "sharding:\n  inputs: {hidden_states: [dp, null, null, null, null]}\n"
    rule = r"""  activations:
    transformer:
      - {module: 'blocks\.\d+', spec: [dp, tp, null]}
"""
    scanned = "compile: {transformer: {scan: true}}\n"
    marker = "sharding_constraint"
    plain = constraints(inputs).count(marker)
    assert constraints(inputs + rule).count(marker) == plain + 2  # one per block
    # blocks as one scan: the loop body holds the block's constraint once, for every block
    plain = constraints(inputs + scanned).count(marker)
    assert constraints(inputs + rule + scanned).count(marker) == plain + 1


def test_large_replicated_tensors_are_reported():
    problems = estimates.build(load_tp("sharding.report_replicated_mb=0.01"),
                          registry_mod.loaded(), devices=8)["problems"]
    [problem] = [p for p in problems if "replicated on every device" in p.message]
    # 10 KiB limit: the time embedder's 24x256 and time projection's 144x24 float32 weights
    assert "2 large tensors" in problem.message
    assert "condition_embedder.time_embedder.linear_1.weight (24.00 KiB)" in problem.message
    assert "condition_embedder.time_proj.weight (13.50 KiB)" in problem.message
    assert problem.path == "sharding.weights.transformer"


def test_plan_json(capsys):
    import json

    from porter import cli
    assert cli.main(["plan", str(TP_RECIPE), "--devices", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mesh"] == {"dp": 2, "tp": 4} and data["problems"] == []
    assert {c["component"] for c in data["components"]} == {"transformer", "vae",
                                                             "text_encoder"}
