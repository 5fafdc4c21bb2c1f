"""A generic or modular pipeline declares no programs: ``porter compile`` finds them by
running the pipeline's own call on abstract components (``porter.aot.dry_run``). What
it finds is what a real run of the same recipe calls: component, method, every input's
shape and dtype, the static arguments, how many calls."""

import pytest

import porter
from porter.errors import UsageError
from porter import registry as registry_mod, recipe
from porter.aot import dry_run, programs, targets
from porter.aot import port as abstract_port
from porter.transforms import jit

from models.ltx import build_ltx_pipeline
from models.wan_t2v import build_wan_t2v_pipeline

LTX = """\
model: {{family: generic, source: {source}, pipeline: LTXPipeline}}
generate: {{prompt: "a cat", height: 32, width: 32, frames: 9, steps: 2, guidance_scale: 3.0,
           max_sequence_length: 16}}
compile:
  transformer:
    methods: [forward]
    static_argnames: [return_dict, num_frames, height, width, rope_interpolation_scale]
  vae: {{methods: [decode]}}
"""
WAN_MODULAR = """\
model: {{family: generic, source: {source}, pipeline: WanModularPipeline}}
generate: {{prompt: "a cat", height: 16, width: 16, frames: 9, steps: 2, guidance_scale: 6.0,
           max_sequence_length: 16}}
"""
CASES = {"ltx": (build_ltx_pipeline, LTX), "wan-modular": (build_wan_t2v_pipeline, WAN_MODULAR)}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_calls_found_are_what_a_run_calls(case, tmp_path, write):
    builder, text = CASES[case]
    builder().save_pretrained(tmp_path / "ckpt")
    path = write("r.yaml", text.format(source=tmp_path / "ckpt"))
    loaded = recipe.load(path)
    found = dry_run.programs(abstract_port.build(loaded, registry_mod.loaded(),
                                                 targets.named("v6e-8")))
    port = porter.load(path)
    with programs.recorded(port.pipe, jit.rules(port.recipe, port.family, "cpu")) as calls:
        port.generate()
    ran = programs.unique(calls)
    assert [(p.signature(), p.calls) for p in found] == \
        [(p.signature(), p.calls) for p in ran]
    assert {p.component: (p.stage, p.per_step) for p in found} == {
        "transformer": ("denoise", 1 if case == "ltx" else 2), "vae": ("decode", 0)}


def test_a_pipeline_without_its_files_is_refused(write):
    loaded = recipe.load(write("r.yaml", WAN_MODULAR.format(source="someone/some-model")))
    port = type("Port", (), {"recipe": loaded, "family": None, "components": {}})
    with pytest.raises(UsageError, match="without its files"):
        dry_run.programs(port)
