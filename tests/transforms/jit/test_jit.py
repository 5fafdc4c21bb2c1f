"""Compile options from the recipe: which methods, static arguments, donation."""

import numpy as np
import torch

from porter import registry as registry_mod, recipe, runtime
from porter.commands.validate import validate
from porter.port.passes import ported as port
from porter.shims.interop import to_device, to_host
from porter.transforms import jit
from porter.transforms import placement

from support import TINY_RECIPE


def test_recipe_replaces_family_defaults(write):
    loaded = recipe.load(write("r.yaml", TINY_RECIPE + """\
compile:
  vae: {methods: []}
  text_encoder: {methods: [forward], static_argnames: [return_dict, output_hidden_states]}
"""))
    family = registry_mod.loaded().family("wan")
    rules = jit.rules(loaded, family, "cpu")
    assert set(rules) == {"transformer", "transformer_2", "text_encoder",
                          "image_encoder"}  # vae: eager
    assert rules["transformer"].methods == ["forward"]
    assert rules["text_encoder"].static_argnames == ["return_dict", "output_hidden_states"]


def test_unknown_component_or_method(write):
    loaded = recipe.load(write("r.yaml", TINY_RECIPE + """\
compile:
  unet: {methods: [forward]}
  vae: {methods: [decoed]}
"""))
    found = {p.path: p for p in validate(loaded, registry_mod.loaded())}
    assert "no component 'unet'" in found["compile.unet"].message
    assert "vae has no method 'decoed'" in found["compile.vae.methods"].message


def test_eager_component_still_runs_on_jax(write):
    from porter_wan.tiny import build_pipeline

    loaded = recipe.load(write("r.yaml", TINY_RECIPE + "compile: {vae: {methods: []}}\n"
                               "mesh: {dp: 1}\n"))
    rt, registry = runtime.start(loaded), registry_mod.loaded()
    pipe = build_pipeline()
    port(pipe, loaded, registry, rt)
    assert type(pipe.vae).__name__ == "AutoencoderKLWan"  # not wrapped for jit
    assert hasattr(pipe.vae.decoder.conv_in.weight, "jax")  # but its weights are on JAX


def test_donated_input_is_consumed():
    from porter.recipe.schema import CompileRule
    from porter_wan.tiny import build_pipeline

    rt = runtime.start(recipe.validate_data(
        {"model": {"family": "wan"}, "mesh": {"dp": 1},
         "generate": {"prompt": "x", "height": 32, "width": 32, "frames": 9, "steps": 1}},
        {}))
    transformer = build_pipeline().transformer.eval()
    placement.apply(transformer, rt, [])
    jitted = jit.apply(transformer, CompileRule(
        methods=["forward"], donate_argnames=["hidden_states"]))
    x = to_device(torch.randn(1, 16, 3, 4, 4), rt)
    with rt.env:
        jitted(hidden_states=x, timestep=to_device(torch.tensor([5.0]), rt),
               encoder_hidden_states=to_device(torch.randn(1, 16, 32), rt), return_dict=False)
    assert x._elem.is_deleted()


def test_xla_options_reach_xla_with_and_without_the_trace_cache(tmp_path):
    """A value XLA refuses fails the first call: proof the options are passed on."""
    import jax
    import pytest

    from porter.recipe.schema import CompileRule
    from porter.transforms.jit.traces import TraceCache
    from porter_wan.tiny import build_pipeline

    rt = runtime.start(recipe.validate_data(
        {"model": {"family": "wan"}, "mesh": {"dp": 1},
         "generate": {"prompt": "x", "height": 32, "width": 32, "frames": 9, "steps": 1}},
        {}))
    bad = {"xla_cpu_experimental_ynn_fusion_type": "NOT_A_FUSION_TYPE"}
    inputs = dict(hidden_states=to_device(torch.randn(1, 16, 3, 4, 4), rt),
                  timestep=to_device(torch.tensor([5.0]), rt),
                  encoder_hidden_states=to_device(torch.randn(1, 16, 32), rt),
                  return_dict=False)
    for traces in (None, TraceCache(tmp_path, "test")):
        transformer = build_pipeline().transformer.eval()
        placement.apply(transformer, rt, [])
        jitted = jit.apply(transformer, CompileRule(methods=["forward"]),
                                         traces, "transformer", bad)
        with rt.env, pytest.raises(jax.errors.JaxRuntimeError, match="NOT_A_FUSION_TYPE"):
            jitted(**inputs)


def test_blocks_compiled_one_by_one(write):
    """modules: the component stays eager (its glue may branch on values); blocks jit."""
    from porter.shims.interop import to_host
    from porter_wan.tiny import build_pipeline

    loaded = recipe.load(write("r.yaml", TINY_RECIPE + r"""mesh: {dp: 1}
compile:
  transformer: {methods: [forward], modules: 'blocks\.\d+'}
""") )
    rt, registry = runtime.start(loaded), registry_mod.loaded()
    pipe = build_pipeline()
    expected = pipe.transformer(torch.ones(1, 16, 3, 4, 4), torch.tensor([5.0]),
                                torch.ones(1, 16, 32), return_dict=False)[0]
    port(pipe, loaded, registry, rt)
    assert type(pipe.transformer).__name__ == "WanTransformer3DModel"  # not wrapped
    assert "forward" in vars(pipe.transformer.blocks[0])  # compiled in place
    assert "forward" not in vars(pipe.transformer.condition_embedder)
    with rt.env:
        got = pipe.transformer(hidden_states=to_device(torch.ones(1, 16, 3, 4, 4), rt),
                               timestep=to_device(torch.tensor([5.0]), rt),
                               encoder_hidden_states=to_device(torch.ones(1, 16, 32), rt),
                               return_dict=False)[0]
    assert (to_host(got) - expected.detach()).abs().max() <= 1e-5
    bad = recipe.load(write("b.yaml", TINY_RECIPE + "compile: {transformer: {modules: 'blokcs'}}\n"))
    [problem] = validate(bad, registry)
    assert "matches no submodule" in problem.message


def test_trace_cache_keys_reuse_and_fallbacks(tmp_path):
    """A program is exported once per key, loaded by a fresh cache, and re-traced when
    shapes or shardings change; host callbacks and donation fall back to jax.jit."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from porter.transforms.jit.traces import TraceCache

    def f(x, scale=2.0):
        return x * scale + 1

    first = TraceCache(tmp_path, "code-v1")
    call = first.jit("f", f, static_argnames=("scale",))
    x = jnp.ones((4, 3))
    assert float(call(x, scale=3.0)[0, 0]) == 4.0
    call(x, scale=3.0)
    assert (first.exported, first.loaded) == (1, 0)
    call(jnp.ones((2, 3)), scale=3.0)  # another shape: another program
    call(x, scale=5.0)  # another static value: another program
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("dp",))
    sharded = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("dp")))
    call(sharded, scale=3.0)  # another sharding: another program
    assert first.exported == 4

    again = TraceCache(tmp_path, "code-v1")
    assert float(again.jit("f", f, static_argnames=("scale",))(x, scale=3.0)[0, 0]) == 4.0
    assert (again.exported, again.loaded) == (0, 1)
    changed = TraceCache(tmp_path, "code-v2")  # other code or recipe: traced afresh
    changed.jit("f", f, static_argnames=("scale",))(x, scale=3.0)
    assert (changed.exported, changed.loaded) == (1, 0)

    def with_callback(x):
        return jax.pure_callback(lambda a: np.asarray(a) * 2,
                                 jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    fallback = TraceCache(tmp_path / "cb", "code-v1")
    assert float(fallback.jit("cb", with_callback)(x)[0, 0]) == 2.0
    assert fallback.exported == 0 and not list((tmp_path / "cb").glob("*.exported"))
    donated = TraceCache(tmp_path / "donate", "code-v1")
    assert float(donated.jit("d", f, donate_argnames=("x",))(jnp.ones(3))[0]) == 3.0
    assert donated.exported == 0


class _Scaled(torch.nn.Module):
    """A module with a buffer and a method of its own signature, as a VAE has."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.tensor([2.0]))

    def forward(self, sample, num_frames: int, return_dict: bool = True):
        return sample * self.scale * num_frames

    def decode(self, z, num_frames: int):
        return self.forward(z, num_frames)


def test_a_compiled_module_keeps_its_signatures_and_buffers(tmp_path):
    """Pipelines read a component's signature (Stable Video Diffusion asks its VAE's
    forward whether it takes num_frames) and call nn.Module.buffers() (diffusers'
    device and dtype lookups; Cosmos 3): a compiled module answers both as the model."""
    import inspect

    from porter.recipe.schema import CompileRule

    rt = runtime.start(recipe.validate_data(
        {"model": {"family": "wan"}, "mesh": {"dp": 1},
         "generate": {"prompt": "x", "height": 32, "width": 32, "frames": 9, "steps": 1}},
        {}))
    module = _Scaled()
    placement.apply(module, rt, [])
    from porter.transforms.jit.traces import TraceCache

    traces = TraceCache(tmp_path, "code")
    compiled = jit.apply(module, CompileRule(methods=["forward", "decode"]),
                                       traces=traces)
    for method in ("forward", "decode"):
        assert inspect.signature(getattr(compiled, method)) == \
            inspect.signature(getattr(module, method))
    assert [tuple(b.shape) for b in compiled.buffers()] == [(1,)]
    with rt.env:
        x = to_device(torch.ones(3), rt)
        out = compiled.decode(x, num_frames=3)  # the buffers reach the program
    assert np.allclose(np.asarray(out.jax()), 6.0)
    assert traces.exported == 1  # its arguments' tree serialises: the trace is kept


def test_encode_runs_around_the_compiled_encode():
    """diffusers' ``encode`` wraps the traceable ``_encode`` in a distribution object:
    with ``_encode`` compiled, a pipeline's ``vae.encode(x)`` calls the program (one
    call, PyTorch's mean); a default method the module lacks is skipped."""
    from porter.recipe.schema import CompileRule
    from porter_wan.tiny import build_pipeline

    rt = runtime.start(recipe.validate_data(
        {"model": {"family": "wan"}, "mesh": {"dp": 1},
         "generate": {"prompt": "x", "height": 32, "width": 32, "frames": 9, "steps": 1}},
        {}))
    vae = build_pipeline().vae.eval()
    video = torch.rand(1, 3, 1, 32, 32) * 2 - 1
    with torch.no_grad():
        expected = vae.encode(video).latent_dist.mean
    placement.apply(vae, rt, [])
    compiled = jit.apply(vae, CompileRule(methods=["decode", "_encode", "_not_here"]))
    assert set(compiled._jitted) == {"decode", "_encode"}
    program, calls = compiled._jitted["_encode"], []
    compiled._jitted["_encode"] = lambda *a, **k: calls.append(1) or program(*a, **k)
    with rt.env:
        mean = to_host(compiled.encode(to_device(video, rt)).latent_dist.mean)
    assert calls == [1]
    np.testing.assert_allclose(mean.numpy(), expected.numpy(), atol=1e-5)


def test_a_language_model_compiles_as_a_text_encoder():
    """A transformers language model (a tiny Gemma 2, Sana's text encoder) would return
    its key/value cache, which no program can return: compiled, it keeps none, and
    its hidden states equal PyTorch's."""
    import transformers

    from porter.recipe.schema import CompileRule

    rt = runtime.start(recipe.validate_data(
        {"model": {"family": "wan"}, "mesh": {"dp": 1},
         "generate": {"prompt": "x", "height": 32, "width": 32, "frames": 9, "steps": 1}},
        {}))
    torch.manual_seed(0)
    model = transformers.Gemma2Model(transformers.Gemma2Config(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8)).eval()
    ids, mask = torch.randint(0, 64, (1, 7)), torch.ones(1, 7, dtype=torch.long)
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).last_hidden_state
    placement.apply(model, rt, [])
    compiled = jit.apply(model, CompileRule(methods=["forward"]))
    with rt.env:
        out = compiled(to_device(ids, rt), attention_mask=to_device(mask, rt))
    assert out.past_key_values is None
    np.testing.assert_allclose(to_host(out.last_hidden_state).numpy(), expected.numpy(),
                               atol=1e-5)
