"""HunyuanVideo plugin: tiny end to end against diffusers; the joint attention's text
padding is masked exactly (the zero-K/V approximation is measurably wrong)."""

import contextlib
import copy

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from porter import registry as registry_mod, recipe, runtime
from porter.port import active, beside, checks, estimates
from porter.shims.interop import to_device, to_host
from porter.transforms.attention import AttentionBackend, kernels

from support import RECIPES
from support.processes import interrupt_at_step

TINY = RECIPES / "hunyuan-tiny.yaml"


@pytest.mark.slow
def test_tiny_matches_diffusers(tmp_path):
    from porter_hunyuan.tiny import build_pipeline

    loaded = recipe.load(TINY, ["generate.steps=2", f"output.dir={tmp_path}"])
    result = run_recipe(loaded)
    pipe = build_pipeline()
    for module in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
        module.eval()
    gen = loaded.generate
    expected = pipe(gen.prompt, height=gen.height, width=gen.width, num_frames=gen.frames,
                    num_inference_steps=gen.steps, guidance_scale=gen.guidance_scale,
                    max_sequence_length=16, generator=torch.Generator().manual_seed(gen.seed),
                    output_type="np").frames[0]
    assert np.abs((expected * 255).round() - result.frames).max() <= 1
    assert "hunyuan.rope_cache" in [p["name"] for p in result.data["patches"]]


def run_recipe(loaded):
    from porter.commands.run import run
    return run(loaded, registry_mod.loaded(), progress=False)


def zero_kv(q, k, v, keep=None, *, scale, **_):
    """The approximation: zero the padded keys and values, keep them in the softmax."""
    if keep is not None:
        valid = jnp.any(kernels.as_4d(keep), axis=(1, 2))  # a key any query may see
        valid = jnp.broadcast_to(valid, (k.shape[0], k.shape[2]))[:, None, :, None]
        k, v = jnp.where(valid, k, 0), jnp.where(valid, v, 0)
    return kernels.reference(q, k, v, None, scale=scale)


def transformer_output(backend: str, registry):
    from porter_hunyuan.tiny import build_pipeline

    loaded = recipe.load(TINY, [f"attention.backend={backend}", "mesh.dp=1"])
    rt = runtime.start(loaded)
    family = registry.family("hunyuan")
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(1, 4, 3, 2, 2, generator=generator)
    text = torch.randn(1, 16, 16, generator=generator)
    mask = torch.zeros(1, 16, dtype=torch.long)
    mask[:, :5] = 1  # 5 real text tokens, 11 padding
    pooled = torch.randn(1, 8, generator=generator)
    inputs = dict(timestep=torch.tensor([500.0]), encoder_hidden_states=text,
                  encoder_attention_mask=mask, pooled_projections=pooled,
                  guidance=torch.tensor([6000.0]))
    from porter.transforms import patches
    with patches.applied(patches.selected(loaded, registry, family)):
        pipe = build_pipeline()
        reference = copy.deepcopy(pipe.transformer).eval()
        with torch.no_grad():
            expected = reference(hidden_states=x, return_dict=False, **inputs)[0]
        calling = beside.ported(pipe, loaded, registry, rt)
        placed = {k: to_device(v, rt) for k, v in inputs.items()}
        with active.transformer_calls(calling), rt.env:
            got = pipe.transformer(hidden_states=to_device(x, rt), return_dict=False,
                                   **placed)[0]
    return to_host(got), expected


def test_joint_attention_padding_is_exact_where_zeroing_is_not():
    registry = registry_mod.loaded()
    registry.attention["zero_kv"] = AttentionBackend("zero_kv", zero_kv, "approximation")
    try:
        exact, expected = transformer_output("blockwise", registry)
        approx, _ = transformer_output("zero_kv", registry)
    finally:
        del registry.attention["zero_kv"]
    scale = expected.abs().max()
    assert (exact - expected).abs().max() / scale <= 1e-5
    assert (approx - expected).abs().max() / scale > 1e-3


def test_frame_rule_and_real_recipe():
    [problem] = checks.recipe_problems(recipe.load(TINY, ["generate.frames=10"]),
                                       registry_mod.loaded())
    assert "4n+1" in problem.message and "try 9 or 13" in problem.hint
    built = estimates.build(recipe.load(RECIPES / "hunyuan.yaml"), registry_mod.loaded(), devices=8)
    assert built["problems"] == []
    transformer = next(c for c in built["components"] if c["component"] == "transformer")
    assert 23 * 2**30 < transformer["bytes"] < 26 * 2**30  # ~12.8 B parameters in bf16


TINY_15 = RECIPES / "hunyuan15-tiny.yaml"


@pytest.mark.slow
def test_tiny_15_matches_diffusers(tmp_path):
    from porter_hunyuan.tiny import build_pipeline_15

    loaded = recipe.load(TINY_15, ["generate.steps=2", f"output.dir={tmp_path}"])
    result = run_recipe(loaded)
    gen = loaded.generate
    pipe = build_pipeline_15(guidance_scale=gen.guidance_scale)
    for module in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
        module.eval()
    expected = pipe(prompt=gen.prompt, negative_prompt=gen.negative_prompt,
                    height=gen.height, width=gen.width, num_frames=gen.frames,
                    num_inference_steps=gen.steps, output_type="np",
                    generator=torch.Generator().manual_seed(gen.seed)).frames[0]
    assert np.abs((expected * 255).round() - result.frames).max() <= 1
    assert "hunyuan.rope_cache_15" in [p["name"] for p in result.data["patches"]]
    # hunyuan.traceable_forward_15: the transformer compiled whole, nothing left eager
    assert "split" not in result.data["timings"]["compile"]


@pytest.mark.slow
def test_untraceable_forward_is_split_automatically(tmp_path, capfd, monkeypatch):
    """Without hunyuan.traceable_forward_15, 1.5's whole forward hits its value branch
    (`if is_t2v:`): the forward runs eagerly with its blocks compiled, Porter says where
    the branch is, the run record keeps the split, and the frames are diffusers' own."""
    from porter.runtime import notices
    from porter_hunyuan.tiny import build_pipeline_15

    monkeypatch.setattr(notices, "_given", [])  # said once a process: this run says it
    loaded = recipe.load(TINY_15, ["generate.steps=1", "patches=[]", f"output.dir={tmp_path}"])
    result = run_recipe(loaded)
    gen = loaded.generate
    pipe = build_pipeline_15(guidance_scale=gen.guidance_scale)
    for module in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
        module.eval()
    expected = pipe(prompt=gen.prompt, negative_prompt=gen.negative_prompt,
                    height=gen.height, width=gen.width, num_frames=gen.frames,
                    num_inference_steps=gen.steps, output_type="np",
                    generator=torch.Generator().manual_seed(gen.seed)).frames[0]
    assert np.abs((expected * 255).round() - result.frames).max() <= 1
    split = result.data["timings"]["compile"]["split"]["transformer"]
    assert "transformer_hunyuan_video15.py" in split["eager"][""]
    assert any(path.startswith("transformer_blocks.") for path in split["compiled"])
    assert "transformer cannot be compiled whole" in capfd.readouterr().err


def test_real_15_recipe_plans():
    built = estimates.build(recipe.load(RECIPES / "hunyuan15.yaml"), registry_mod.loaded(), devices=8)
    assert built["problems"] == []
    transformer = next(c for c in built["components"] if c["component"] == "transformer")
    assert 15 * 2**30 < transformer["bytes"] < 16 * 2**30  # 8.3 B parameters in bf16
    glyph = next(c for c in built["components"] if c["component"] == "text_encoder_2")
    assert glyph["bytes"] % 4 == 0 and glyph["bytes"] > 800 * 2**20  # float32 ByT5


@pytest.mark.slow
def test_true_guidance_matches_diffusers(tmp_path):
    """HunyuanVideo is guidance-distilled; ``true_cfg_scale`` adds real classifier-free
    guidance: two branches, batched over the data axis here."""
    from porter_hunyuan.tiny import build_pipeline

    loaded = recipe.load(TINY, ["generate.steps=2", "generate.negative_prompt=blurry",
                                "generate.extra={true_cfg_scale: 3.0}", "mesh.dp=2",
                                "generate.cfg_parallel=true", f"output.dir={tmp_path}"])
    result = run_recipe(loaded)
    pipe = build_pipeline()
    for module in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
        module.eval()
    gen = loaded.generate
    expected = pipe(gen.prompt, negative_prompt=gen.negative_prompt, true_cfg_scale=3.0,
                    height=gen.height, width=gen.width, num_frames=gen.frames,
                    num_inference_steps=gen.steps, guidance_scale=gen.guidance_scale,
                    max_sequence_length=16, generator=torch.Generator().manual_seed(gen.seed),
                    output_type="np").frames[0]
    assert np.abs((expected * 255).round() - result.frames).max() <= 1
    unguided = run_recipe(recipe.load(TINY, ["generate.steps=2", "generate.negative_prompt="
                                             "blurry", f"output.dir={tmp_path / 'one'}"]))
    assert np.abs(unguided.frames.astype(int) - result.frames).max() > 1  # it guided


@pytest.mark.slow
def test_15_interrupted_run_resumes_bit_identically(tmp_path, monkeypatch):
    from diffusers import FlowMatchEulerDiscreteScheduler

    from porter.commands.run import run
    from porter.errors import Interrupted

    whole = run_recipe(recipe.load(TINY_15, [f"output.dir={tmp_path / 'whole'}"]))
    loaded = recipe.load(TINY_15, [f"output.dir={tmp_path / 'part'}"])
    interrupt_at_step(monkeypatch, FlowMatchEulerDiscreteScheduler, 2)
    with pytest.raises(Interrupted):
        run(loaded, registry_mod.loaded(), progress=False)
    monkeypatch.undo()
    resumed = run(loaded, registry_mod.loaded(), progress=False, resume=True)
    assert resumed.data["timings"]["resumed_from_step"] == 2
    assert torch.equal(resumed.latents, whole.latents)
    assert (resumed.frames == whole.frames).all()


def test_vae_mid_block_frame_by_frame_equals_the_masked_attention():
    """hunyuan.vae_frame_causal: the VAE's frame-causal mid-block attention as one
    unmasked attention per frame gives the masked one's values (three latent frames)."""
    from porter_hunyuan.patches import VAE_FRAME_CAUSAL
    from porter_hunyuan.tiny import build_pipeline

    vae = build_pipeline().vae.eval()
    latents = torch.randn(1, 4, 3, 4, 6, generator=torch.Generator().manual_seed(0))
    block, hidden = vae.decoder.mid_block, vae.decoder.conv_in(latents)
    with torch.no_grad():
        expected = block(hidden)
        with VAE_FRAME_CAUSAL.applied():
            ours = block(hidden)
    assert block.attentions[0] is not None
    assert torch.allclose(ours, expected, atol=1e-5)


def test_15_vae_attention_frame_by_frame_equals_the_masked_attention():
    """hunyuan.vae_frame_causal_15: HunyuanVideo 1.5's VAE attention block, whose
    frame-causal mask diffusers builds token by token, as one unmasked attention per
    frame gives the masked one's values (three latent frames)."""
    from porter_hunyuan.patches import VAE_FRAME_CAUSAL_15
    from porter_hunyuan.tiny import build_pipeline_15

    vae = build_pipeline_15().vae.eval()
    attn = vae.decoder.mid_block.attentions[0]
    hidden = torch.randn(1, attn.in_channels, 3, 4, 6, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = attn(hidden)
        with VAE_FRAME_CAUSAL_15.applied():
            ours = attn(hidden)
            assert "patched by porter" in type(attn).forward.__doc__
            later = hidden.clone()
            later[:, :, 2] += 1.0  # the last frame changed: the first one's output is not
            moved = attn(later)
    assert torch.allclose(ours, expected, atol=1e-5)
    assert torch.equal(moved[:, :, 0], ours[:, :, 0])
    assert not torch.allclose(moved[:, :, 2], ours[:, :, 2])


def _15_inputs(image_zero: bool):
    """A batch of two whose text and glyph masks pad differently (the first sequence
    with a gap inside its mask), as the 1.5 pipeline hands them to the transformer."""
    gen = torch.Generator().manual_seed(1)
    mask = torch.tensor([[1, 1, 0, 1, 0, 0], [1, 1, 1, 1, 1, 0]])
    mask_2 = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1]])
    image = torch.zeros(2, 3, 12) if image_zero else torch.randn(2, 3, 12, generator=gen)
    return {"hidden_states": torch.randn(2, 9, 3, 4, 4, generator=gen),
            "timestep": torch.tensor([500.0, 500.0]),
            "encoder_hidden_states": torch.randn(2, 6, 16, generator=gen),
            "encoder_attention_mask": mask,
            "encoder_hidden_states_2": torch.randn(2, 4, 32, generator=gen),
            "encoder_attention_mask_2": mask_2, "image_embeds": image, "return_dict": False}


@contextlib.contextmanager
def _15_patches():
    """The 1.5 transformer patches of recipes/hunyuan15.yaml."""
    from porter_hunyuan.patches import KEY_MASK_15, TRACEABLE_FORWARD_15

    with TRACEABLE_FORWARD_15.applied(), KEY_MASK_15.applied():
        yield


@pytest.mark.parametrize("image_zero", [True, False], ids=["t2v", "i2v"])
def test_15_traceable_forward_is_diffusers_forward(image_zero):
    """hunyuan.traceable_forward_15 and hunyuan.key_mask_15: the same output as
    diffusers' forward, in PyTorch and compiled whole by JAX (diffusers' own forward
    cannot be traced: its branch on `torch.all(image_embeds == 0)` needs a value)."""
    import jax

    from porter.shims.compat import import_torchax
    from porter_hunyuan.tiny import build_pipeline_15

    model = build_pipeline_15().transformer.eval()
    inputs = _15_inputs(image_zero)
    with torch.no_grad():
        expected = model(**inputs)[0]
        with _15_patches():
            patched = model(**inputs)[0]
    torch.testing.assert_close(patched, expected, rtol=0, atol=1e-6)

    tx = import_torchax()
    env = tx.default_env()
    with env:
        jittable = tx.interop.JittableModule(copy.deepcopy(model).to("jax"))
    tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}

    def program(params, buffers, arrays):
        return jittable.functional_call("forward", params, buffers, return_dict=False,
                                        **arrays)[0]

    with _15_patches(), env, torch.no_grad():
        compiled = jax.jit(tx.interop.jax_view(program))(
            tx.interop.jax_view(jittable.params), tx.interop.jax_view(jittable.buffers),
            {k: env.to_xla(v).jax() for k, v in tensors.items()})
    np.testing.assert_allclose(np.asarray(compiled), expected.numpy(), atol=1e-5, rtol=0)


def test_15_text_tokens_reorder_as_diffusers_does():
    from porter_hunyuan.transformer15 import valid_first

    gen = torch.Generator().manual_seed(0)
    parts = [torch.randn(3, n, 5, generator=gen) for n in (2, 4, 6)]
    masks = [torch.rand(3, n, generator=gen) > 0.4 for n in (2, 4, 6)]
    tokens, mask = valid_first(parts, masks, zeroed=[False, True, True])
    for b in range(3):  # diffusers' loop, one sequence at a time
        (i, t2, t), (im, m2, m) = [p[b] for p in parts], [k[b] for k in masks]
        want = torch.cat([i[im], t2[m2], t[m], i[~im], torch.zeros_like(t2[~m2]),
                          torch.zeros_like(t[~m])])
        want_mask = torch.cat([im[im], m2[m2], m[m], im[~im], m2[~m2], m[~m]])
        assert torch.equal(tokens[b], want) and torch.equal(mask[b], want_mask)


def test_15_attention_sees_a_key_mask(monkeypatch):
    """hunyuan.key_mask_15: the blocks' attention gets the text padding as a key mask
    (batch, 1, 1, tokens), which splash reads as segment ids, not diffusers' square
    tokens x tokens matrix; the output is diffusers'."""
    import torch.nn.functional as F

    from porter_hunyuan.patches import KEY_MASK_15
    from porter_hunyuan.tiny import build_pipeline_15

    model = build_pipeline_15().transformer.eval()
    inputs = _15_inputs(image_zero=True)
    seen, sdpa = [], F.scaled_dot_product_attention

    def spy(*args, attn_mask=None, **kwargs):  # diffusers passes query= key= value=
        seen.append(tuple(attn_mask.shape))
        return sdpa(*args, attn_mask=attn_mask, **kwargs)

    with torch.no_grad():
        expected = model(**inputs)[0]
        monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
        with KEY_MASK_15.applied():
            patched = model(**inputs)[0]
    tokens = 4 * 4 * 3 + 6 + 4 + 3  # video, text, glyph, image
    # the refiner's own attention (text only) keeps its mask; the blocks' is a key mask
    assert (2, 1, 1, tokens) in seen and not any(s[-2:] == (tokens, tokens) for s in seen)
    torch.testing.assert_close(patched, expected, rtol=0, atol=1e-6)
