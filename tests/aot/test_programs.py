"""Each family's declared programs are what its runs call, found from shapes alone."""

import pytest
import torch

from porter.aot import programs

from support import RECIPES
from support.aot import IMAGE

RUNS = [
    ("wan-tiny.yaml", []),
    ("wan-tiny.yaml", ["generate.guidance_scale=1.0"]),
    # a VAE that tiles at this size decodes in one call, not chunk by chunk
    ("wan-tiny.yaml", ["setup={vae: [enable_tiling]}", "generate.width=320",
                       "generate.frames=9"]),
    ("wan-tiny-tp.yaml", []),
    ("wan-tiny-tp.yaml", ["mesh={dp: 1, tp: 8}", "generate.cfg_parallel=false"]),
    ("wan22-i2v-tiny.yaml", []),
    ("wan22-ti2v-tiny.yaml", []),
    ("wan-flf2v-tiny.yaml", []),
    ("cogvideox-tiny.yaml", []),
    ("cogvideox-tiny.yaml", ["model.variant=v1.5"]),
    ("cogvideox-tiny.yaml", ["model.variant=v1-i2v", f"generate.image={IMAGE}"]),
    ("hunyuan-tiny.yaml", []),
    # true guidance: both texts through both encoders (the tiny byte-level tokenizer
    # truncates the template before the prompt, so without text_cache_mb=0 the second
    # Llama call would be answered from memory)
    ("hunyuan-tiny.yaml", ["generate.extra={true_cfg_scale: 2.0}", "runtime.text_cache_mb=0"]),
    ("hunyuan15-tiny.yaml", []),
    ("hunyuan15-tiny.yaml", ["generate.prompt=a cat"]),  # no quoted words: no ByT5 call
    ("hunyuan15-tiny.yaml", ["generate.cfg_parallel=true", "mesh.dp=2"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,overrides", RUNS, ids=lambda v: v if isinstance(v, str)
                         else " ".join(v))
def test_declared_programs_are_what_a_run_calls(name, overrides):
    """What `porter compile` compiles, at a recipe's shapes, is each compiled call of a
    real run of the same recipe: component, method, every input's shape and dtype on
    the device, the static arguments, and how many calls."""
    import porter
    from porter.loading import abstract
    from porter.transforms import jit, setup

    port = porter.load(RECIPES / name, *overrides, "generate.steps=3")
    rules = jit.rules(port.recipe, port.family, "cpu")
    with programs.recorded(port.pipe, rules) as calls:
        port.generate()
    ran = programs.unique(calls)
    modules = abstract.components(port.family, port.recipe)
    for component, _, method, params in setup.calls(port.recipe):  # as compile's port
        getattr(modules[component], method)(**params)
    declared = programs.unique(port.family.programs(port.recipe, modules))
    assert [(p.signature(), p.calls) for p in declared] == \
        [(p.signature(), p.calls) for p in ran]
    assert ran  # every family here compiles something


def test_program_signatures_tell_inputs_apart():
    a = programs.Program("vae", "decode", (programs.Input((1, 4), torch.float32),))
    b = programs.Program("vae", "decode", (programs.Input((1, 4), torch.bfloat16),))
    merged = programs.unique([a, a, b])
    assert [p.calls for p in merged] == [2, 1]


def test_submodule_calls_are_found_from_shapes_alone():
    """A compiled submodule's calls, found by running the code around it on the meta
    device: one program per input shape, counted; code that needs values raises."""
    class Tiles(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(4, 4)

        def decode(self, x):  # 3 tiles of 4 rows, then the 2 left over
            return torch.cat([self.inner(x[i:i + 4]) for i in range(0, x.shape[0], 4)])

        def forward(self, x):
            return self.inner(x) if bool((x > 0).all()) else x

    with torch.device("meta"):  # as porter compile builds components: no values
        model = Tiles()
    found = programs.submodule_calls(model, "inner", programs.Program(
        "vae", "decode", (programs.Input((14, 4), torch.float32),), calls=2))
    assert sorted((p.args[0].shape, p.calls, p.name) for p in programs.unique(found)) == [
        ((2, 4), 2, "vae.inner"), ((4, 4), 6, "vae.inner")]
    with pytest.raises(Exception):
        programs.submodule_calls(model, "inner", programs.Program(
            "vae", "forward", (programs.Input((14, 4), torch.float32),)))
