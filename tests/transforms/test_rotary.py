"""Rotary tables precomputed on the host: same output, no table-building in the graph."""

import re

import torch

from porter import registry as registry_mod, recipe, runtime
from porter.port.passes import ported as port
from porter.shims.interop import to_device, to_host
from porter.transforms import patches

from support import RECIPES
from support.references import lowered_text


def ported_transformer(precompute: bool):
    """Lowered StableHLO text and output of the tiny transformer, with or without the cache."""
    from porter_wan.tiny import build_pipeline

    loaded = recipe.load(RECIPES / "wan-tiny.yaml",
                         [f"rotary.precompute={str(precompute).lower()}", "mesh.dp=1"])
    rt, registry = runtime.start(loaded), registry_mod.loaded()
    family = registry.family("wan")
    generator = torch.Generator().manual_seed(0)
    # the recipe's latent grid: 17 frames -> 5, 64x64 pixels -> 8x8
    x = torch.randn(1, 16, 5, 8, 8, generator=generator)
    text = torch.randn(1, 32, 32, generator=generator)
    t = torch.tensor([500.0])
    with patches.applied(patches.selected(loaded, registry, family)):
        pipe = build_pipeline()
        expected = pipe.transformer.eval()(x, t, text, return_dict=False)[0]
        port(pipe, loaded, registry, rt)
        module = pipe.transformer
        inputs = dict(hidden_states=to_device(x, rt), timestep=to_device(t, rt),
                      encoder_hidden_states=to_device(text, rt))
        text = lowered_text(module, rt, **inputs)
        with rt.env:
            out = module(return_dict=False, **inputs)[0]
    return text, to_host(out), expected.detach()


def test_cached_tables_give_identical_output_and_leave_the_graph():
    plain_text, plain, expected = ported_transformer(False)
    cached_text, cached, _ = ported_transformer(True)
    assert torch.equal(plain, cached)
    assert (cached - expected).abs().max() / expected.abs().max() <= 1e-5
    # The model's own tables (max_seq_len 32 x head dim 12) feed the graph only
    # when they are sliced and concatenated there.
    assert "tensor<32x12xf32>" in plain_text
    assert "tensor<32x12xf32>" not in cached_text
    concat = r"stablehlo.concatenate"
    assert len(re.findall(concat, cached_text)) == len(re.findall(concat, plain_text)) - 2
    # the cached (cos, sin) tables arrive as inputs of the recipe's sequence length
    assert cached_text.count("tensor<1x80x1x12xf32>") >= 2


def test_cache_falls_back_for_other_shapes():
    from porter.transforms import rotary
    from porter_wan.patches import ROPE_CACHE
    from porter_wan.tiny import build_pipeline

    rope = build_pipeline().transformer.rope
    marker = (torch.zeros(1), torch.ones(1))
    rope.__dict__[rotary.CACHE_ATTR] = {}
    rope.register_buffer("a", marker[0], persistent=False)
    rope.register_buffer("b", marker[1], persistent=False)
    rope.__dict__[rotary.CACHE_ATTR][(5, 8, 8)] = ("a", "b")
    with ROPE_CACHE.applied():
        assert rope(torch.zeros(1, 16, 5, 8, 8))[1] is rope.b
        assert rope(torch.zeros(1, 16, 3, 8, 8))[0].shape == (1, 48, 1, 12)
