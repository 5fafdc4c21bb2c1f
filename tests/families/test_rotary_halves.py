"""Queries and keys rotated in halves order (porter/families/rotary_halves.py): the
models' rotation with each head's channels reordered, the same attention, and on a TPU
none of the broadcasts the interleaved form costs."""

import pytest
import torch

from porter import recipe, registry as registry_mod
from porter.families import rotary_halves
from porter.registry import builtin
from porter.transforms import patches

from support import RECIPES
from support.aot import needs_libtpu


def tables(tokens: int, width: int):
    """Rotary tables as Wan's and Helios's are: each angle's value twice, for a pair."""
    angles = torch.rand(1, tokens, 1, width // 2) * 6
    return (torch.cos(angles).repeat_interleave(2, -1),
            torch.sin(angles).repeat_interleave(2, -1))


def test_the_rotation_is_the_models_with_each_heads_channels_in_halves_order():
    from diffusers.models.transformers import transformer_helios

    x = torch.randn(2, 7, 3, 12)
    cos, sin = tables(7, 12)
    models = transformer_helios.apply_rotary_emb_transposed(x, torch.cat([cos, sin], -1)[:, :, 0])
    halves = torch.cat([torch.arange(0, 12, 2), torch.arange(1, 12, 2)])
    assert torch.equal(rotary_halves.rotated(x, cos, sin), models[..., halves])


@pytest.mark.parametrize("variant", [None, "i2v"])
def test_wans_transformer_in_halves_order_gives_diffusers_output(variant):
    """Text-to-video, and image-to-video (whose cross-attention adds the image's keys:
    diffusers' code)."""
    from porter_wan import tiny

    pipe = tiny.build(variant, image=variant is not None)
    model = pipe.transformer
    inputs = {"hidden_states": torch.randn(1, model.config.in_channels, 3, 16, 16),
              "timestep": torch.tensor([500]),
              "encoder_hidden_states": torch.randn(1, 8, model.config.text_dim)}
    if variant:
        inputs["encoder_hidden_states_image"] = torch.randn(1, 4, model.config.image_dim)
    with torch.no_grad():
        theirs = model(**inputs, return_dict=False)[0]
        with builtin.WAN_ROTARY_HALVES.applied():
            ours = model(**inputs, return_dict=False)[0]
    assert not torch.equal(ours, theirs)  # the patch ran: the scores' sums reordered
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("module, patch", [
    ("transformer_wan", builtin.WAN_ROTARY_HALVES),
    ("transformer_chronoedit", builtin.CHRONOEDIT_ROTARY_HALVES),
    ("transformer_wan_animate", builtin.WAN_ANIMATE_ROTARY_HALVES)])
def test_each_copy_of_wans_processor_in_halves_order_gives_its_attention(module, patch):
    """Wan's self-attention and the copies ChronoEdit and Wan-Animate keep in their own
    modules: each patch reaches its own module's processor, the same output."""
    import importlib

    model = importlib.import_module(f"diffusers.models.transformers.{module}")
    torch.manual_seed(0)
    attn = model.WanAttention(dim=24, heads=2, dim_head=12, processor=model.WanAttnProcessor())
    x = torch.randn(1, 7, 24)
    rotary = tables(7, 12)
    with torch.no_grad():
        theirs = attn(x, rotary_emb=rotary)
        with patch.applied():
            ours = attn(x, rotary_emb=rotary)
    assert not torch.equal(ours, theirs)  # the patch ran: the scores' sums reordered
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model, patch, guidance", [
    ("helios", builtin.HELIOS_ROTARY_HALVES, 1.0),
    ("skyreels_v2_df", builtin.SKYREELS_V2_ROTARY_HALVES, 6.0)])
def test_generic_pipelines_in_halves_order_make_diffusers_video(model, patch, guidance):
    """Helios (its own rotation) and SkyReels-V2's diffusion forcing (Wan's processor,
    copied into its own module): each the video plain diffusers makes."""
    import importlib

    import numpy as np

    pipe = getattr(importlib.import_module(f"models.{model}"), f"build_{model}_pipeline")()

    def video():
        return pipe("a cat", height=16, width=16, num_frames=9, num_inference_steps=2,
                    guidance_scale=guidance, max_sequence_length=16, output_type="np",
                    generator=torch.Generator().manual_seed(0)).frames[0]

    theirs = video()
    with patch.applied():
        ours = video()
    assert not np.array_equal(ours, theirs)  # the patch ran: the scores' sums reordered
    assert np.abs(ours - theirs).max() < 1e-5


def test_a_processor_without_diffusers_helpers_is_kept_as_it_is():
    """Before diffusers 0.36 Wan's module had no ``parallel_config`` to pass on: the
    patch then leaves the processor alone (here, a function of a module with none)."""
    import json

    assert rotary_halves.wan_processor(json.dumps) is json.dumps


def test_every_wan_run_and_the_shipped_generic_recipes_rotate_in_halves():
    registry = registry_mod.loaded()
    for name, wanted in (("wan-tiny.yaml", {"core.wan_rotary_halves"}),
                         ("wan-generic-base.yaml", {"core.wan_rotary_halves"}),
                         ("skyreels-v2-df-14b.yaml", {"core.skyreels_v2_rotary_halves"})):
        loaded = recipe.load(RECIPES / name)
        family = registry.families[loaded.model.family]
        chosen = {patch.name for patch, _ in patches.selected(loaded, registry, family)}
        assert wanted <= chosen, name


@needs_libtpu
def test_on_a_tpu_the_rotation_in_halves_spends_no_broadcasts():
    """Compiled for v6e-1 (one head group of 2,048 tokens): the models' interleaved
    writes, as a run lowers them (``core.setitem``: a broadcast into place and a
    select), against the halves; the TPU compiler's own cycle estimates."""
    import jax
    import jax.numpy as jnp
    from diffusers.models.transformers import transformer_helios
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from porter.aot import hlo, targets
    from porter.shims.compat import import_torchax

    interop = import_torchax().interop
    mesh = targets.mesh(targets.named("v6e-1"), {"x": 1})
    x = jax.ShapeDtypeStruct((1, 2048, 4, 128), jnp.bfloat16,
                             sharding=NamedSharding(mesh, P()))
    freqs = jax.ShapeDtypeStruct((1, 2048, 256), jnp.float32,
                                 sharding=NamedSharding(mesh, P()))

    def estimates(rotation):
        with builtin.SETITEM.applied():
            text = jax.jit(interop.jax_view(rotation)).lower(x, freqs).compile().as_text()
        found = hlo.estimated_cycles(text)
        return (sum(e.cycles for e in found),
                sum(e.cycles for e in found if e.kind == "broadcast"))

    interleaved, interleaved_broadcasts = estimates(
        transformer_helios.apply_rotary_emb_transposed)
    halves, halves_broadcasts = estimates(rotary_halves.helios_rotation(None))
    assert interleaved_broadcasts > interleaved / 5 and halves_broadcasts == 0
    assert halves < interleaved / 2
