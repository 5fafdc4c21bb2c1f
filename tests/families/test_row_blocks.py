"""Wan's VAE decoder on row blocks (``porter.families.row_blocks``): the same pixels as
diffusers' own decode, for Wan 2.1's VAE and Wan 2.2's (patchified, residual), with
rows that divide into the blocks and rows that do not; chosen on a TPU only. Through a
port on 8 devices split over width: tests/transforms/test_vae_split.py."""

import copy
from types import SimpleNamespace

import pytest
import torch
from diffusers import AutoencoderKLWan

from porter import recipe
from porter.families import row_blocks
from porter.recipe.schema import ActivationRule
from porter.transforms import sharding

from support import RECIPES

#: the tiny configurations of diffusers' tests of AutoencoderKLWan, Wan 2.1's and one
#: shaped as Wan 2.2 TI2V-5B's (residual blocks, 2x2 patches, 16x compression)
WAN21 = dict(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
             temperal_downsample=[False, True, True])
WAN22 = dict(base_dim=8, decoder_base_dim=16, z_dim=8, dim_mult=[1, 2, 2, 2],
             num_res_blocks=1, temperal_downsample=[False, True, True], is_residual=True,
             patch_size=2, in_channels=12, out_channels=12, scale_factor_spatial=16)


def pair(config: dict):
    torch.manual_seed(0)
    vae = AutoencoderKLWan(**config).eval()
    ported = copy.deepcopy(vae)
    assert row_blocks.keep_in_blocks(ported)
    blocked = ported.decoder._row_blocks
    assert row_blocks.keep_in_blocks(ported)  # once: a second call patches nothing
    assert ported.decoder._row_blocks is blocked
    return vae, ported


@pytest.mark.parametrize("config", [WAN21, WAN22], ids=["wan2.1", "wan2.2"])
@pytest.mark.parametrize("latents", [
    (1, 3, 16, 12),  # 16 rows: 2 a block
    (1, 3, 6, 5),  # 6 rows: the last two blocks padding
    (2, 2, 9, 7),  # two videos, 9 rows: 2 a block, 7 of the last 8 padding
    (1, 1, 3, 4),  # the first frame alone
])
def test_the_decode_in_row_blocks_is_diffusers_decode(config, latents):
    vae, ported = pair(config)
    batch, frames, rows, width = latents
    z = torch.randn(batch, vae.config.z_dim, frames, rows, width,
                    generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = vae.decode(z).sample
        got = ported.decode(z).sample
    assert got.shape == expected.shape
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()
    assert ported.decoder._row_blocks.layout is None  # nothing held between calls


def test_blocks_go_and_come_back():
    layout = row_blocks.Layout.of(6)
    assert (layout.blocks, layout.block_rows) == (8, 1)
    x = torch.arange(2 * 3 * 1 * 12 * 2.0).reshape(2, 3, 1, 12, 2)  # twice the rows
    blocks = row_blocks.to_blocks(x, layout)
    assert blocks.shape == (16, 3, 1, 2, 2)  # 16 rows, padded from 12
    assert torch.equal(blocks[2], x[0, :, :, 2:4])  # block 1 of the first video
    assert torch.equal(row_blocks.from_blocks(blocks, layout), x)
    blocks[12:] = 99.0  # the padding blocks (6 and 7) as a decoder leaves them: garbage
    # each block's halo rows are its neighbours' edge rows, zeros past the image's
    halo = row_blocks.with_halo(row_blocks.padding_zeroed(blocks, layout), layout, 1)
    assert halo.shape == (16, 3, 1, 4, 2)
    whole = row_blocks.from_blocks(blocks, layout)[0]  # the first video, (3, 1, 12, 2)
    first, second = halo[0], halo[2]  # blocks 0 and 1 of the first video
    assert torch.equal(first[:, :, 0], torch.zeros(3, 1, 2))
    assert torch.equal(first[:, :, 1:3], whole[:, :, 0:2])
    assert torch.equal(first[:, :, 3], whole[:, :, 2])
    assert torch.equal(second[:, :, 0], whole[:, :, 1])
    sixth = halo[2 * 5]  # rows 10-11, the image's last: below them the padding, zeroed
    assert torch.equal(sixth[:, :, 3], torch.zeros(3, 1, 2))
    assert torch.equal(halo[2 * 6][:, :, 1:], torch.zeros(3, 1, 3, 2))  # padding alone


def test_a_patched_module_called_by_itself_is_its_class_own():
    """Outside a decoder call (a piece compiled on its own): the whole maps' forward."""
    vae, ported = pair(WAN21)
    x = torch.randn(1, vae.decoder.conv_in.in_channels, 2, 5, 6)
    with torch.no_grad():
        assert torch.equal(ported.decoder.conv_in(x), vae.decoder.conv_in(x))
        mid = torch.randn(1, vae.decoder.mid_block.attentions[0].dim, 1, 5, 6)
        assert torch.equal(ported.decoder.mid_block.attentions[0](mid),
                           vae.decoder.mid_block.attentions[0](mid))
    assert not row_blocks.keep_in_blocks(torch.nn.Linear(2, 2))  # not Wan's decoder


def test_row_blocks_are_chosen_on_a_tpu_where_the_rows_stay_whole():
    torch.manual_seed(0)
    vae = AutoencoderKLWan(**WAN21)
    tiny = recipe.load(RECIPES / "wan-tiny.yaml")
    tpu = SimpleNamespace(axes={"dp": 2, "tp": 4}, platform="tpu")
    split = sharding.vae_split("vae", vae, tpu)  # the width over dp and tp
    assert sharding.in_row_blocks(tiny, "vae", vae, tpu, split)
    assert sharding.in_row_blocks(tiny, "vae", vae, tpu, [])  # not split: whole rows
    assert sharding.in_row_blocks(tiny, "vae_2", vae, tpu, split)  # a second video VAE
    assert not sharding.in_row_blocks(tiny, "audio_vae", vae, tpu, [])

    def rule(*spec):
        return [ActivationRule(module=sharding.VAE_BLOCKS, spec=list(spec))]
    # a rule with the rows over dp and the width over tp (the Wan recipes' before they
    # took the default)
    assert not sharding.in_row_blocks(tiny, "vae", vae, tpu,
                                      rule(None, None, None, "dp", "tp"))
    assert not sharding.in_row_blocks(tiny, "vae", vae, tpu, rule("...", "dp", "tp"))
    one_row_axis = SimpleNamespace(axes={"dp": 1, "tp": 8}, platform="tpu")
    assert sharding.in_row_blocks(tiny, "vae", vae, one_row_axis,
                                  rule(None, None, None, "dp", "tp"))  # dp of 1: whole
    assert not sharding.in_row_blocks(tiny, "vae", vae, tpu,
                                      rule("dp", None, None, None, "tp"))  # the batch
    # a spec naming more axes than the maps have constrains nothing
    assert sharding.in_row_blocks(tiny, "vae", vae, tpu,
                                  rule("...", "tp", None, None, None, None, None))
    # a VAE the recipe tiles or compiles in pieces keeps its class's own forwards
    for chosen in ("setup={vae: [enable_tiling]}",
                   "compile={vae: {methods: [decode], modules: decoder}}"):
        assert not sharding.in_row_blocks(recipe.load(RECIPES / "wan-tiny.yaml", [chosen]),
                                          "vae", vae, tpu, [])
    gpu = SimpleNamespace(axes=tpu.axes, platform="gpu")
    assert not sharding.in_row_blocks(tiny, "vae", vae, gpu,
                                      sharding.vae_split("vae", vae, gpu))
    assert not sharding.in_row_blocks(tiny, "vae", torch.nn.Linear(2, 2), tpu, [])


@pytest.mark.parametrize("name", ["wan14b.yaml", "wan1.3b.yaml", "wan14b-sp.yaml",
                                  "wan14b-16.yaml", "wan22-a14b.yaml", "wan-i2v-14b.yaml",
                                  "wan1.3b-causvid.yaml", "wan-generic-base.yaml"])
def test_the_shipped_wan_recipes_decode_in_row_blocks_on_a_tpu(name):
    """Their meshes as they ship them ({dp: 2, tp: 4}, {dp: 2, sp: 4}, ring x sp, tp: 8):
    each chip keeps its rows whole, the width split over every axis of the mesh."""
    torch.manual_seed(0)
    vae = AutoencoderKLWan(**WAN21)
    loaded = recipe.load(RECIPES / name)
    tpu = SimpleNamespace(axes=dict(loaded.mesh), platform="tpu")
    rules = sharding.activation_rules(loaded, "vae", vae, tpu)
    assert rules, "the VAE split over the chips"
    assert sharding.in_row_blocks(loaded, "vae", vae, tpu, rules)
