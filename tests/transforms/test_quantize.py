"""8-bit weights and matmuls: rows quantized alone, the matmul on 8-bit operands equal
to the dequantized product, the format each chip gets, the layers chosen, the recipe's
problems, weights quantized as read from a checkpoint equal to those quantized on the
host, and each format's error through a whole port within its documented bound."""

import numpy as np
import pytest
import torch

from porter import registry as registry_mod, recipe, runtime
from porter.commands import verify as verify_command
from porter.errors import RecipeError
from porter.loading import abstract
from porter.port import passes
from porter.transforms.building import Building
from porter.transforms import Checking, quantize
from porter.transforms.quantize import formats, linear

from support import RECIPES

NAMES = list(formats.FORMATS)


@pytest.mark.parametrize("name", NAMES)
def test_each_row_is_quantized_alone(name):
    """A row's values and scale need only that row: a process reading only its rows
    quantizes them as a whole read would. An all-zero row stays zero (no NaN)."""
    fmt = formats.FORMATS[name]
    rows = torch.randn(6, 32, generator=torch.Generator().manual_seed(0)) * \
        torch.tensor([1e-3, 1.0, 30.0, 0.0, 5.0, 1e3])[:, None]
    values, scale = fmt.quantize(rows)
    part_values, part_scale = fmt.quantize(rows[2:5])
    assert values.dtype == fmt.weight_dtype and scale.dtype == torch.float32
    assert torch.equal(part_values.float(), values[2:5].float())
    assert torch.equal(part_scale, scale[2:5])
    back = values.float() * scale[:, None]
    assert torch.equal(back[3], torch.zeros(32))
    step = 1 / 127 if fmt.weight == "int8" else 2 ** -4  # int8 / e4m3's 3-bit mantissa
    assert ((back - rows).abs() <= step * rows.abs().amax(1, keepdim=True)).all()


@pytest.mark.parametrize("name", NAMES)
def test_the_matmul_is_the_dequantized_product(name):
    """``matmul`` on 8-bit operands against float64 ``x . (values * scale)^T + bias``
    (for fp8 and int8: x quantized per token the same way, so only the sums' rounding
    differs); and within the format's rounding of the full-precision product."""
    import jax.numpy as jnp

    fmt = formats.FORMATS[name]
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 64, generator=generator)
    w = torch.randn(48, 64, generator=generator) / 8
    bias = torch.randn(48, generator=generator)
    values, scale = fmt.quantize(w)
    got = np.asarray(linear.matmul(jnp.asarray(x.numpy()), jnp.asarray(_np(values)),
                                   jnp.asarray(scale.numpy()), jnp.asarray(bias.numpy()),
                                   fmt))
    weight = values.double() * scale.double()[:, None]
    operand = x.double()
    if fmt.activations:
        token = (x.abs().amax(-1, keepdim=True) / fmt.largest).double()
        q, _ = fmt.quantize(x.reshape(-1, 64))  # the same rule, per token
        operand = q.double().reshape(x.shape) * token
    expected = operand @ weight.T + bias.double()
    exact = x.double() @ w.double().T + bias.double()
    sums = 1e-2 if fmt.kind == "fp8" and fmt.activations else 1e-5  # bf16 accumulator out
    assert np.abs(got - expected.numpy()).max() <= sums * np.abs(expected.numpy()).max()
    rounding = 0.06 if fmt.kind == "fp8" else 0.01
    assert np.abs(got - exact.numpy()).max() <= rounding * np.abs(exact.numpy()).max()


def _np(tensor):
    from porter.shims.interop import numpy_view
    return numpy_view(tensor)


@pytest.mark.parametrize("kind,asked,got", [
    ("TPU v6 lite", "auto", "int8"), ("TPU v5 lite", "int8", "int8"),
    ("TPU v6 lite", "fp8", None), ("TPU v6 lite", "fp8-weights", "fp8-weights"),
    ("TPU7x", "auto", "fp8"), ("TPU7x", "int8", "int8"),  # no int8 rate published
    ("TPU v4", "int8", None), ("TPU v5", "auto", "int8"),
    ("NVIDIA H100 80GB HBM3", "auto", "fp8"),
    ("NVIDIA A100-SXM4-80GB", "fp8", None), ("NVIDIA A100-SXM4-80GB", "auto", "int8"),
    ("NVIDIA A10G", "fp8", None), ("NVIDIA RTX 2000 Ada Generation", "auto", "fp8"),
    ("a chip from next year", "fp8", "fp8")])
def test_each_chip_gets_the_format_it_runs_faster(kind, asked, got):
    platform = "tpu" if "TPU" in kind else "gpu"
    fmt, why = formats.resolve(asked, platform, kind)
    assert (fmt.name if fmt else None) == got
    assert bool(why) == (got is None)
    assert formats.resolve(asked, "cpu", "cpu")[0] is not None  # fidelity is measured here


def test_a_format_the_chip_runs_no_faster_is_refused_with_the_weights_only_one():
    loaded = recipe.load(RECIPES / "wan-tiny.yaml", ["quantize.format=fp8"])
    tpu = type("Runtime", (), {"platform": "tpu", "device_kind": "TPU v6 lite"})
    with pytest.raises(RecipeError) as caught:
        quantize.chip_format(loaded, tpu)
    [problem] = caught.value.problems
    assert "TPU v6 lite runs fp8 matmuls no faster than bfloat16 (it runs int8 faster)" \
        in problem.message and "'fp8-weights'" in problem.hint


def test_scales_follow_their_weights_rows_whatever_rule_matched_them():
    from porter.shims.walk import named_tensors
    from porter.transforms.sharding import assign
    from porter.recipe.schema import ShardRule

    layer = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 8))
    quantize.quantized(layer, ["0", "1"], formats.FORMATS["int8"])
    rules = [ShardRule(match=r"0\.weight", spec=["tp", None]),
             ShardRule(match=r"1\.weight", spec=[None, "tp"]), ShardRule(match=".*", spec=[])]
    specs = {a.name: a.spec for a in assign(named_tensors(layer), rules)}
    assert specs["0.weight_scale"] == ("tp",) and specs["1.weight_scale"] == (None,)


def test_a_weight_quantized_on_the_host_with_nan_is_counted():
    """Its scale is NaN where the row was: placement counts the scales as it counts
    parameters, so the run refuses it (naming it) as it refuses a NaN weight."""
    from porter.transforms import placement

    layer = torch.nn.Sequential(torch.nn.Linear(8, 4))
    with torch.no_grad():
        layer[0].weight[2, 3] = float("nan")
    quantize.quantized(layer, ["0"], formats.FORMATS["int8"])
    found = {}
    placement.apply(layer, runtime.start(recipe.load(RECIPES / "wan-tiny.yaml")), [],
                    nonfinite=found)
    assert found == {"0.weight_scale": 1}


def test_validate_for_a_target_refuses_what_its_chips_run_no_faster():
    """`validate --target` and `plan --target` say it before any compile or rental."""
    from porter.aot import targets
    from porter.commands.validate import validate

    v6e = targets.named("v6e-8")
    registry = registry_mod.loaded()
    for name, refused in [("fp8", True), ("int8", False), ("fp8-weights", False)]:
        loaded = recipe.load(RECIPES / "wan14b.yaml", [f"quantize.format={name}"])
        found = [p.path for p in validate(loaded, registry, target=v6e)]
        assert ("quantize.format" in found) == refused, (name, found)


def meta_modules(*overrides, name="wan-tiny.yaml"):
    """The recipe, its family and its components' sketches (what the fits read)."""
    loaded = recipe.load(RECIPES / name, list(overrides))
    family = registry_mod.loaded().family(loaded.model.family)
    return loaded, family, abstract.sketches(family, loaded)


def test_the_family_default_takes_the_blocks_layers_and_keeps_the_rest():
    loaded, family, modules = meta_modules("quantize.format=int8")
    names = quantize.chosen(loaded, family, modules["transformer"])
    per_block = ["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q",
                 "attn2.to_k", "attn2.to_v", "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2"]
    assert names == [f"blocks.{b}.{layer}" for b in (0, 1) for layer in per_block]
    edges, _, _ = meta_modules("quantize.format=int8", "quantize.keep_edge_blocks=true")
    assert quantize.chosen(edges, family, modules["transformer"]) == []  # 2 blocks: both
    hunyuan, family, modules = meta_modules("quantize.format=int8", name="hunyuan-tiny.yaml")
    names = quantize.chosen(hunyuan, family, modules["transformer"])
    assert names and not any("norm" in n or "embed" in n or "proj_out" == n for n in names)


def test_the_recipes_problems_are_named_where_they_are():
    loaded = recipe.load(RECIPES / "wan-tiny.yaml", [
        "quantize.format=int8", "quantize.include=['(']", "quantize.components=[vea]"])
    registry = registry_mod.loaded()
    family = registry.family("wan")
    [bad_regex] = passes.check_problems(Checking(loaded, registry, family))
    assert bad_regex.path == "quantize.include.0" and "invalid regex" in bad_regex.message
    loaded, family, modules = meta_modules("quantize.format=int8", "quantize.components=[vea]",
                                           r"quantize.include=['blocks\.\d+\.nothing']",
                                           "quantize.components=[transformer, vea]")
    found = [p.message for p in passes.fit_problems(
        Checking(loaded, registry, family, modules, {"dp": 1}))]
    assert any("no component 'vea'" in m for m in found)
    assert any("transformer: no linear layer matches" in m for m in found)
    unset = recipe.load(RECIPES / "wan-tiny.yaml", ["quantize.components=[transformer]"])
    assert "no format is given" in \
        passes.check_problems(Checking(unset, registry, family))[0].message


def ported(source, *overrides):
    loaded = recipe.load(RECIPES / "wan-tiny-tp.yaml",
                         [f"model.source={source}", "model.dtype=bfloat16", *overrides])
    registry = registry_mod.loaded()
    building = Building(loaded, registry, registry.family("wan"), runtime.start(loaded))
    with building.stack:
        return passes.build(building)


def test_weights_quantized_as_read_equal_those_quantized_on_the_host(tmp_path):
    """A checkpoint's weights (built empty, read at placement) quantized row by row as
    each process's rows are read, on a tp=4 mesh, equal the tiny model's quantized on
    the host; each scale is split as its weight's rows are."""
    from porter_wan.tiny import build_pipeline

    build_pipeline().save_pretrained(tmp_path)
    host = ported("tiny", "quantize.format=fp8")
    read = ported(str(tmp_path), "quantize.format=fp8")
    assert read.quantize.pending["transformer"] and not host.quantize.pending["transformer"]
    assert host.quantize.layers == read.quantize.layers == {"transformer": 20}
    layers = [dict(host.modules["transformer"].named_modules()),
              dict(read.modules["transformer"].named_modules())]
    for name in ("blocks.0.attn1.to_q", "blocks.1.ffn.net.2"):
        a, b = (m[name] for m in layers)
        assert isinstance(b, linear.QuantizedLinear) and str(b.weight.dtype) == \
            "torch.float8_e4m3fn"
        for key in ("weight", "weight_scale"):
            got, expected = getattr(b, key).jax(), getattr(a, key).jax()
            assert np.array_equal(np.asarray(got).astype(np.float32),
                                  np.asarray(expected).astype(np.float32)), (name, key)
        weight_rows = b.weight.jax().sharding.spec[:1]
        assert tuple(b.weight_scale.jax().sharding.spec) == tuple(weight_rows)
    assert read.ported().checkpoint["quantize"] == {"format": "fp8",
                                                    "layers": {"transformer": 20}}


# what each format measured through the tiny Wan (float32, 2 blocks) against PyTorch in
# float32, max |diff| / max |reference| per block (docs/quantize.md): int8 2.1e-3,
# fp8 1.4e-2, int8-weights 1.2e-3, fp8-weights 9.5e-3; bounds about twice that
TINY_BOUND = {"int8": 4e-3, "fp8": 3e-2, "int8-weights": 3e-3, "fp8-weights": 2e-2}


@pytest.mark.parametrize("name", NAMES)
def test_each_formats_error_stays_within_its_documented_bound(name):
    """``porter verify`` (the quantized port against PyTorch in float32): every block and
    the output within the format's measured bound, cosines near 1, and verify's own
    default tolerance the format's."""
    loaded = recipe.load(RECIPES / "wan-tiny.yaml", [f"quantize.format={name}"])
    result = verify_command.verify(loaded, registry_mod.loaded())
    assert result["tolerance"] == formats.FORMATS[name].tolerance and result["ok"]
    rows = result["modules"] + [result["output"]]
    assert len(rows) == 3
    for row in rows:
        assert row["max_rel"] <= TINY_BOUND[name], row
        assert row["cosine"] >= 0.9995, row
    assert max(r["max_rel"] for r in rows) > 1e-4  # 8 bits, not float32's 3e-7
