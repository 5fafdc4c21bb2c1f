"""The tiny HunyuanVideo pipelines come in eval mode, as ``from_pretrained`` gives a
pipeline (their dropouts are 0 at these settings, so eval mode is what there is to see;
1.5's T5 glyph encoder has dropout 0.1)."""

import pytest
import torch

from support import in_training

from porter_hunyuan.tiny import build_pipeline, build_pipeline_15


@pytest.mark.parametrize("build", [build_pipeline, build_pipeline_15],
                         ids=["1.0", "1.5"])
def test_every_module_is_in_eval_mode(build):
    pipe = build()
    assert in_training(pipe) == []
