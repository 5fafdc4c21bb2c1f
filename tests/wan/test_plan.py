"""Real-size Wan recipes plan from the plugin's official configs: no weights, no devices."""

import pytest

from porter import registry as registry_mod, recipe
from porter.commands.validate import validate
from porter.port import estimates

from support import RECIPES

BF16, F32 = 2, 4


def wan14b_transformer_bytes_per_device(tp: int) -> int:
    """By hand, from Wan2.1-T2V-14B's config: width 5120, FFN 13824, 40 blocks."""
    D, F, L, heads_dim = 5120, 13824, 40, 128
    sharded = (6 * D * D + 6 * D        # attn1 + attn2: q, k, v weights and biases
               + 4 * D                  # norm_q, norm_k of both attentions
               + 2 * D * D              # to_out weights (input columns split)
               + F * D + F + D * F      # FFN in (weight, bias), FFN out (weight)
               ) * BF16 * L // tp
    replicated_per_block = (2 * D + D) * BF16 + (2 * D + 6 * D) * F32  # out/FFN biases;
    #                                          norm2 weight+bias and scale_shift_table in f32
    time_proj = (6 * D * D + 6 * D) * BF16 // tp                        # split over tp
    top = ((D * 16 * 2 * 2 + D) * BF16                                   # patch embedding
           + (D * 256 + D + D * D + D) * F32                             # time embedder, f32
           + (D * 4096 + D + D * D + D) * BF16                           # text embedder
           + (64 * D + 64) * BF16                                        # proj_out
           + 2 * D * F32                                                 # scale_shift_table
           + 2 * 1024 * heads_dim * F32)                                 # rope tables, f32
    return sharded + L * replicated_per_block + time_proj + top


def test_wan14b_plan_on_8_devices_matches_hand_count():
    built = estimates.build(recipe.load(RECIPES / "wan14b.yaml"), registry_mod.loaded(), devices=8)
    assert built["mesh"] == {"dp": 2, "tp": 4} and built["problems"] == []
    transformer = next(c for c in built["components"] if c["component"] == "transformer")
    assert transformer["bytes_per_device"] == wan14b_transformer_bytes_per_device(tp=4)
    # the whole 14B transformer: ~14.3 B parameters, mostly bfloat16
    assert 26.5 * 2**30 < transformer["bytes"] < 27 * 2**30
    vae = next(c for c in built["components"] if c["component"] == "vae")
    assert vae["bytes"] == vae["bytes_per_device"]  # replicated, float32


@pytest.mark.parametrize("name", ["wan14b.yaml", "wan1.3b.yaml", "wan22-a14b.yaml",
                                  "wan-i2v-14b.yaml", "wan22-i2v-a14b.yaml",
                                  "wan22-ti2v-5b.yaml", "wan-flf2v-14b.yaml",
                                  "wan22-i2v-tiny.yaml", "wan22-ti2v-tiny.yaml",
                                  "wan-flf2v-tiny.yaml", "wan-lora-tiny.yaml"])
def test_real_recipes_validate_against_official_shapes(name):
    loaded = recipe.load(RECIPES / name, ["runtime.cpu_devices=8"])
    assert validate(loaded, registry_mod.loaded()) == []


def test_divisibility_checked_on_real_shapes():
    """Width 1536 and FFN 8960 do not divide by tp=5."""
    loaded = recipe.load(RECIPES / "wan1.3b.yaml", ["mesh.tp=5", "mesh.dp=1",
                                                     "generate.cfg_parallel=false"])
    problems = estimates.build(loaded, registry_mod.loaded(), devices=5)["problems"]
    text = "\n".join(p.render() for p in problems)
    assert "blocks.0.attn1.to_q.weight shape [1536, 1536]: dim 0 (1536) does not " \
           "divide by tp=5 (and 179 more tensors)" in text
    assert "axis sizes that divide it: 1, 2, 3, 4" in text


def test_wan14b_step_flops_and_attention_memory():
    built = estimates.build(recipe.load(RECIPES / "wan14b.yaml"), registry_mod.loaded(), devices=8)
    est = built["estimates"]
    S = 21 * (720 // 16) * (1280 // 16)   # latent frames x patches: 75,600 tokens
    D, F, T, layers = 5120, 13824, 512, 40
    # multiply-adds x 2: projections, self-attention, cross-attention, FFN
    block = 2 * (4 * S * D * D + 2 * S * S * D + 2 * S * D * D + 2 * T * D * D
                 + 2 * S * T * D + 2 * S * D * F)
    assert est["tokens"] == S
    assert est["flops_per_step"] == 2 * layers * block  # two guidance passes
    assert est["flops_per_step_per_device"] == 2 * layers * block // 8
    # scores per layer and device: batch 2 split over dp=2, 40 heads over tp=4
    self_attention = est["attention"]["self"]
    assert self_attention["reference_bytes_per_device"] == 1 * 10 * S * S * 4
    assert self_attention["blockwise_bytes_per_device"] == 1 * 10 * 1024 * 1024 * 4


def test_wan14b_activation_estimate():
    est = estimates.build(recipe.load(RECIPES / "wan14b.yaml"), registry_mod.loaded(),
                     devices=8)["estimates"]["activations"]
    S = 75600
    # batch 2 (cond + uncond) split over dp=2; bfloat16; FFN columns split over tp=4
    assert est["hidden"]["bytes_per_device"] == 1 * S * 5120 * BF16
    assert est["ffn"]["bytes_per_device"] == 1 * S * 13824 * BF16 // 4


def test_ti2v_5b_plan_is_what_its_recipe_says():
    """The numbers in recipes/wan22-ti2v-5b.yaml's comment."""
    built = estimates.build(recipe.load(RECIPES / "wan22-ti2v-5b.yaml"), registry_mod.loaded(),
                       devices=8)
    assert not built["problems"]
    assert built["estimates"]["tokens"] == 31 * 22 * 40
    assert round(built["weights_bytes_per_device"] / 2**30, 2) == 7.67
