"""porter bench with a cache: a pipeline's own loop with and without it."""

import pytest

slow = pytest.mark.slow  # these compile and run models


@slow
def test_bench_compares_a_pipeline_loop_with_and_without_its_cache():
    from porter import recipe as recipe_mod
    from porter.commands import bench

    from support import RECIPES

    loaded = recipe_mod.load(RECIPES / "hunyuan-tiny.yaml",
                             ["generate.steps=10", "cache={method: first_block, threshold: 0.3}"])
    result = bench.cache_compared(loaded)
    assert result["method"] == "first_block" and result["blocks_total"] == 20
    assert result["denoise_s"]["cached"] > 0 and result["denoise_s"]["uncached"] > 0
    assert result["blocks_computed"] == 16 and result["latents_relative_l2"] > 0  # 4 skipped
    assert "cache first_block: denoise" in bench.render_cache(result)
