"""A VAE's feature maps split over width across the mesh (``sharding.vae_split``): the
default on an accelerator mesh, replaced by any rule list of the recipe's, and equal to
the one-device decode (on a TPU's mesh, in row blocks too). Real-width decodes split
over 8 devices: tests/e2e/test_real_size.py."""

from types import SimpleNamespace

import pytest
import torch

from porter import recipe, registry as registry_mod, runtime
from porter.port import active, beside
from porter.shims.interop import to_device, to_host
from porter.transforms import patches, sharding

from support import RECIPES, vae_split_rule

TINY = RECIPES / "wan-tiny.yaml"
TPU = SimpleNamespace(axes={"dp": 2, "tp": 4, "sp": 1}, platform="tpu")
DEFAULT_RULE = vae_split_rule()  # what vae_split gives a {dp: 2, tp: 4} accelerator mesh


def tiny_pipeline():
    from porter_wan.tiny import build_pipeline
    return build_pipeline()


def test_a_vae_splits_over_every_axis_of_an_accelerator_mesh():
    vae = tiny_pipeline().vae
    [rule] = sharding.vae_split("vae", vae, TPU)
    assert rule.module == sharding.VAE_BLOCKS and rule.spec == ["...", ["dp", "tp"]]
    # CPU devices share the host's cores: one device decodes there
    assert sharding.vae_split("vae", vae, SimpleNamespace(axes=TPU.axes, platform="cpu")) == []
    assert sharding.vae_split("vae", vae, SimpleNamespace(axes={"dp": 1}, platform="tpu")) == []
    assert sharding.vae_split("vae_2", vae, TPU) == [rule]  # a second video VAE
    assert sharding.vae_split("text_encoder", vae, TPU) == []  # VAEs only
    assert sharding.vae_split("audio_vae", vae, TPU) == []  # mel bins, not width
    assert sharding.vae_split("vae", torch.nn.Linear(2, 2), TPU) == []  # no blocks
    # a convolutional encoder but a transformer decoder: the decode would not split
    encoder_only = torch.nn.Module()
    encoder_only.encoder = vae.encoder
    assert sharding.vae_split("vae", encoder_only, TPU) == []


def test_the_recipe_rules_replace_the_default():
    vae = tiny_pipeline().vae
    default = sharding.activation_rules(recipe.load(TINY), "vae", vae, TPU)
    assert default == sharding.vae_split("vae", vae, TPU)
    # an empty list: no split (the VAE decodes on one device)
    assert sharding.activation_rules(recipe.load(TINY, ["sharding.activations.vae=[]"]),
                                     "vae", vae, TPU) == []
    [own] = sharding.activation_rules(recipe.load(TINY, [DEFAULT_RULE.replace(
        "['...', [dp, tp]]", "[null, null, null, dp, tp]")]), "vae", vae, TPU)
    assert own.spec == [None, None, None, "dp", "tp"]
    # a recipe that tiles its VAE or compiles it in pieces has chosen its split
    for chosen in ("setup={vae: [enable_tiling]}",
                   "compile={vae: {methods: [decode], modules: decoder}}"):
        assert sharding.activation_rules(recipe.load(TINY, [chosen]), "vae", vae, TPU) == []


def test_leading_axes_fit_any_number_of_axes():
    assert sharding.aligned(["...", ["dp", "tp"]], 5) == (None,) * 4 + (("dp", "tp"),)
    assert sharding.aligned(["...", ["dp", "tp"]], 4) == (None,) * 3 + (("dp", "tp"),)
    assert sharding.aligned(["...", "tp", None], 1) is None  # nothing to constrain
    assert sharding.aligned([None, "tp"], 5) == (None, "tp")


def test_leading_axes_go_first_in_an_activation_spec_only():
    ok = recipe.load(TINY, ["mesh={dp: 2, tp: 4}", DEFAULT_RULE])
    assert sharding.rule_problems(ok) == []
    bad = recipe.load(TINY, ["mesh={dp: 2, tp: 4}", DEFAULT_RULE.replace(
        "['...', [dp, tp]]", "[null, '...', tp]"),
        "sharding.weights.vae=[{match: 'x', spec: ['...', tp]}]"])
    problems = sharding.rule_problems(bad)
    assert {p.path for p in problems} == {"sharding.activations.vae.0.spec",
                                          "sharding.weights.vae.0.spec"}
    assert all("goes first in an activation rule's spec only" in p.hint for p in problems)


def through_the_vae(mesh: str, *extra: str, platform: str | None = None):
    """The tiny Wan VAE's decode of fixed latents and encode of a fixed video (an
    image-to-video input's path), ported on ``mesh`` (as for ``platform``: the CPU
    devices taken for an accelerator's): host tensors, and the device decode."""
    import dataclasses

    loaded = recipe.load(TINY, [f"mesh={mesh}", *extra])
    rt = runtime.start(loaded)
    if platform is not None:
        rt = dataclasses.replace(rt, platform=platform)
    pipe = tiny_pipeline()
    registry = registry_mod.loaded()
    generator = torch.Generator().manual_seed(5)
    latents = torch.randn(1, 16, 3, 6, 16, generator=generator)  # rows: not 8 blocks' own
    video = torch.rand(1, 3, 5, 64, 128, generator=generator) * 2 - 1  # a frame, a chunk
    family = registry.family(loaded.model.family)
    with patches.applied(patches.selected(loaded, registry, family)):
        calling = beside.ported(pipe, loaded, registry, rt)
        with active.entered(calling), rt.env:
            decoded = pipe.vae.decode(to_device(latents, rt), return_dict=False)[0]
            # the compiled method, as image-to-video calls it (porter_wan.i2v._latents)
            encoded = pipe.vae._encode(to_device(video, rt))[:, :pipe.vae.config.z_dim]
    in_blocks = getattr(pipe.vae.decoder, "_row_blocks", None) is not None
    assert calling.ported.weights["vae"].get("row_blocks") == (8 if in_blocks else None)
    return to_host(decoded), to_host(encoded), decoded, in_blocks


@pytest.mark.slow
def test_a_vae_split_over_8_devices_equals_one_device():
    """The default split (no rule in the recipe, a mesh taken for a TPU's), as the port
    places it; a recipe's own rule is the same rule (test_the_recipe_rules_replace_the_
    default), placed by the same pass as Wan 1.3B's real-size rules (tests/e2e)."""
    one, one_encoded, _, plain = through_the_vae("{dp: 1}")
    split, split_encoded, raw, in_blocks = through_the_vae("{dp: 2, tp: 4}", platform="tpu")
    # on a TPU the decoder runs on row blocks (porter.families.row_blocks)
    assert in_blocks and not plain
    # the last block's output split over width: the frames come back that way
    assert raw.jax().sharding.spec[-1] == ("dp", "tp")
    assert (split - one).abs().max() / one.abs().max() <= 1e-5
    assert (split_encoded - one_encoded).abs().max() / one_encoded.abs().max() <= 1e-5
