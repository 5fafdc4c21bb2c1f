"""A Wan-style transformer's residual split along its width under ``tp``
(porter/families/width.py): which pipelines take it, and a SkyReels-V2 diffusion
forcing video split as the unsplit one (AnyFlow FAR's: tests/families/test_far.py)."""

import diffusers
import numpy as np
import pytest
from models.helios import build_helios_pipeline
from models.skyreels_v2_df import build_skyreels_v2_df_pipeline
from models.wan_t2v import build_wan_t2v_pipeline
from support import RECIPES, WAN_TP2

from porter.families import width
from porter.recipe import load
from porter.registry import loaded

RECIPE = """\
model: {family: generic, source: %s, pipeline: SkyReelsV2DiffusionForcingPipeline}
generate: {prompt: "a cat", height: 16, width: 16, frames: 17, steps: 2,
           guidance_scale: 6.0, max_sequence_length: 16,
           extra: {base_num_frames: 9, overlap_history: 5}}
"""
HELIOS = """\
model: {family: generic, source: %s, pipeline: HeliosPipeline}
generate: {prompt: "a cat", height: 16, width: 16, frames: 5, steps: 2,
           guidance_scale: 1.0, max_sequence_length: 16,
           extra: {num_latent_frames_per_chunk: 2}}
"""
WAN = """\
model: {family: generic, source: %s, pipeline: WanPipeline}
generate: {prompt: "a cat", height: 16, width: 16, frames: 9, steps: 2,
           guidance_scale: 6.0, max_sequence_length: 16}
"""
SPLIT = WAN_TP2


def test_the_pipelines_with_wans_blocks_split_their_residual(tmp_path):
    """FAR's, Helios's and SkyReels-V2 diffusion forcing's pipelines (a frame's timestep
    modulates its tokens, whole on every chip otherwise) and Wan's own and those built
    on its transformer split under a head axis of more than one device; another
    pipeline does not, nor one not known before loading."""
    for name in ("AnyFlowFARPipeline", "HeliosPipeline", "HeliosPyramidPipeline",
                 "SkyReelsV2DiffusionForcingPipeline",
                 "SkyReelsV2DiffusionForcingImageToVideoPipeline",
                 "SkyReelsV2DiffusionForcingVideoToVideoPipeline", "WanPipeline",
                 "WanImageToVideoPipeline", "WanVideoToVideoPipeline", "WanVACEPipeline",
                 "LucyEditPipeline", "ChronoEditPipeline", "WanAnimatePipeline",
                 "SkyReelsV2Pipeline", "SkyReelsV2ImageToVideoPipeline"):
        assert width.splits(getattr(diffusers, name)), name
    for name in ("LTXPipeline", "CogVideoXPipeline", "WanAnimate2ModularPipeline"):
        assert not width.splits(getattr(diffusers, name)), name
    (tmp_path / "r.yaml").write_text(RECIPE % tmp_path)
    recipe, cls = load(tmp_path / "r.yaml", SPLIT), diffusers.SkyReelsV2DiffusionForcingPipeline
    assert [(r.module, r.spec) for r in width.width_split(recipe, cls, {"tp": 2})] == \
        [(width.WIDTH_BLOCKS, [None, None, "tp"])]
    assert width.width_split(recipe, cls, {"tp": 1}) == []
    assert width.width_split(recipe, None, {"tp": 2}) == []
    # heads that do not divide the axis (attention splits the tokens there): no split
    generic = loaded().family("generic")
    assert generic.default_activations(recipe, "transformer", {"tp": 4},
                                       {"num_attention_heads": 2}) == []
    assert len(generic.default_activations(recipe, "transformer", {"tp": 2},
                                           {"num_attention_heads": 2})) == 1


def test_the_wan_family_splits_each_transformers_residual_under_the_head_axis():
    """Both of Wan 2.2's experts, the batch where attention holds it; no split where the
    head axis has one device or the heads do not divide it (attention splits the tokens
    there), and none over ``sp`` (the tokens split there)."""
    from porter.transforms import sharding

    from porter_wan import tiny

    wan = loaded().family("wan")
    recipe = load(RECIPES / "wan-tiny-tp.yaml")
    eight = {"num_attention_heads": 8}
    for name in ("transformer", "transformer_2"):
        assert [(r.module, r.spec) for r in wan.default_activations(
            recipe, name, {"dp": 2, "tp": 4}, eight)] == \
            [(width.WIDTH_BLOCKS, ["dp", None, "tp"])]
    assert wan.default_activations(recipe, "transformer", {"dp": 8, "tp": 1}, eight) == []
    # the tiny model's own 2 heads over tp=4, read from the module's configuration
    model = tiny.build(None).transformer
    assert wan.default_activations(recipe, "transformer", {"dp": 2, "tp": 4},
                                   model.config) == []
    rt = type("Runtime", (), {"axes": {"dp": 2, "tp": 4}, "platform": "tpu"})
    assert sharding.activation_rules(recipe, "transformer", model, rt, wan) == []
    # heads over sp: the width split would take sp too, the tokens' split comes first
    rt = type("Runtime", (), {"axes": {"dp": 2, "sp": 4}, "platform": "tpu"})
    over_sp = load(RECIPES / "wan-tiny-sp.yaml", ["attention.head_axis=sp"])
    assert wan.default_activations(over_sp, "transformer", rt.axes, eight)[0].spec == \
        ["dp", None, "sp"]
    [rule] = sharding.activation_rules(over_sp, "transformer", None, rt, wan)
    assert rule.spec == ["dp", "sp", None]


@pytest.mark.slow
def test_a_wan_video_split_along_the_width_is_the_unsplit_one():
    """The tiny Wan over dp=2 x tp=4 (recipes/wan-tiny-tp.yaml; 8 heads, 2 a device)
    with its family's width split, and with none: the same video within a level; the
    split holds each block's three updates of its residual; the record says it."""
    import porter
    from porter.transforms import sharding
    from porter_wan import tiny

    model = tiny.build(None).transformer
    eight_heads = "model.config.num_attention_heads=8"
    rules = loaded().family("wan").default_activations(
        load(RECIPES / "wan-tiny-tp.yaml"), "transformer", {"dp": 2, "tp": 4},
        {"num_attention_heads": 8})
    hooks = sharding.constrain_activations(model, None, rules)
    assert len(hooks) == 3 * model.config.num_layers
    videos, splits = [], []
    for overrides in ([], ["sharding.activations.transformer=[]"]):
        with porter.load(RECIPES / "wan-tiny-tp.yaml", eight_heads, *overrides) as pipe:
            made = pipe.generate()
        videos.append(made.frames.astype(int))
        splits.append(made.record["weights"]["components"]["transformer"]
                      .get("default_split"))
    assert splits == [["dp", "tp"], None]
    assert np.abs(videos[0] - videos[1]).max() <= 1


@pytest.mark.slow
@pytest.mark.parametrize("build, recipe", [(build_skyreels_v2_df_pipeline, RECIPE),
                                           (build_helios_pipeline, HELIOS),
                                           (build_wan_t2v_pipeline, WAN)],
                         ids=["skyreels-df", "helios", "wan"])
def test_a_video_split_is_the_unsplit_one(tmp_path, build, recipe):
    """SkyReels-V2 diffusion forcing, Helios and Wan over ``tp=2`` with the default split
    (the generic family's, constraining each block's three updates of its residual):
    the video of the same run unsplit, within a level; the record says the split."""
    import porter
    from porter.transforms import sharding

    model = build()
    model.save_pretrained(tmp_path / "model")
    (tmp_path / "r.yaml").write_text(recipe % (tmp_path / "model"))
    rules = loaded().family("generic").default_activations(
        load(tmp_path / "r.yaml", SPLIT), "transformer", {"tp": 2})
    hooks = sharding.constrain_activations(model.transformer, None, rules)
    assert len(hooks) == 3 * model.transformer.config.num_layers
    videos, splits = [], []
    for overrides in (SPLIT, [*SPLIT, "sharding.activations.transformer=[]"]):
        with porter.load(tmp_path / "r.yaml", *overrides) as pipe:
            made = pipe.generate()
        videos.append(made.frames.astype(int))
        splits.append(made.record["weights"]["components"]["transformer"]
                      .get("default_split"))
    assert splits == [["tp"], None]
    assert np.abs(videos[0] - videos[1]).max() <= 1
