"""Dtype overrides: named tensors stay float32, and parity with PyTorch holds."""

import copy

import torch

from porter import loading, registry as registry_mod, recipe, runtime
from porter.commands.validate import validate
from porter.port.passes import ported as port
from porter.shims.interop import to_device, to_host

from support import TINY_RECIPE

MIXED = TINY_RECIPE.replace("{family: wan, source: tiny}",
                            "{family: wan, source: tiny, dtype: bfloat16}") + r"""
dtypes:
  components: {vae: float32}
  overrides:
    transformer:
      - {match: 'condition_embedder\.time_embedder\..*', dtype: float32}
      - {match: '(blocks\.\d+\.)?scale_shift_table', dtype: float32}
      - {match: 'blocks\.\d+\.norm2\..*', dtype: float32}
  text_embeddings: float32
"""


def test_overrides_keep_named_tensors_float32(write):
    loaded = recipe.load(write("mixed.yaml", MIXED))
    family = registry_mod.loaded().family("wan")
    pipe = loading.load_pipeline(family, loaded)
    tensors = dict(pipe.transformer.named_parameters())
    assert tensors["condition_embedder.time_embedder.linear_1.weight"].dtype == torch.float32
    assert tensors["blocks.1.scale_shift_table"].dtype == torch.float32
    assert tensors["scale_shift_table"].dtype == torch.float32
    assert tensors["blocks.0.norm2.weight"].dtype == torch.float32
    assert tensors["blocks.0.attn1.to_q.weight"].dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in pipe.vae.parameters())
    assert all(p.dtype == torch.bfloat16 for p in pipe.text_encoder.parameters())
    rt = runtime.start(loaded)
    port(pipe, loaded, registry_mod.loaded(), rt)
    inner = pipe.transformer._model
    assert str(inner.scale_shift_table.jax().dtype) == "float32"
    assert str(inner.blocks[0].attn1.to_q.weight.jax().dtype) == "bfloat16"


def test_mixed_precision_parity_with_pytorch(write):
    loaded = recipe.load(write("mixed.yaml", MIXED))
    family = registry_mod.loaded().family("wan")
    pipe = loading.load_pipeline(family, loaded)
    reference = copy.deepcopy(pipe.transformer)  # same dtypes, run by PyTorch on CPU
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(1, 16, 3, 4, 4, generator=generator).to(torch.bfloat16)
    t = torch.tensor([500.0])
    text = torch.randn(1, 16, 32, generator=generator).to(torch.bfloat16)
    with torch.no_grad():
        expected = reference(x, t, text, return_dict=False)[0].float()
    rt = runtime.start(loaded)
    port(pipe, loaded, registry_mod.loaded(), rt)
    with rt.env:
        got = pipe.transformer(hidden_states=to_device(x, rt), timestep=to_device(t, rt),
                               encoder_hidden_states=to_device(text, rt), return_dict=False)[0]
    got = to_host(got).float()
    # bfloat16 has 8 bits of mantissa: 2**-8 = 0.4% per rounding; allow a few roundings
    assert ((got - expected).abs().max() / expected.abs().max()).item() <= 3e-2


def test_override_matching_nothing_is_reported(write):
    text = MIXED.replace(r"blocks\.\d+\.norm2", r"blocks\.\d+\.nrom2")
    problems = validate(recipe.load(write("typo.yaml", text)), registry_mod.loaded())
    [problem] = problems
    assert problem.path == "dtypes.overrides.transformer.2.match"
    assert "matches no tensor" in problem.message and problem.line


def test_float64_buffers_become_float32_on_host():
    from porter.transforms import dtypes

    module = torch.nn.Module()
    module.register_buffer("table", torch.arange(4, dtype=torch.float64) / 3,
                           persistent=False)
    dtypes.apply(module, torch.bfloat16, [type("R", (), {"match": "table",
                                                         "dtype": "float32"})()])
    assert module.table.dtype == torch.float32
    assert module.table[1].item() == torch.tensor(1 / 3, dtype=torch.float32).item()
