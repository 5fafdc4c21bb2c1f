"""Flex attention under torchax (``porter.shims.flex``'s masks and
``porter.transforms.attention.flex``'s attention; core patches ``core.block_mask`` and
``core.flex_attention``): PyTorch's results, where torchax alone fails."""

import sys
import types

import numpy as np
import pytest
import torch
from torch.nn.attention import flex_attention as flex

from porter.registry import builtin
from porter.transforms.attention import flex as route
from porter.shims.compat import import_torchax

from matrix import check

torchax = import_torchax()


@pytest.fixture(params=["dense", "blockwise"])
def way(request, monkeypatch):
    """Both of the patch's ways: every score at once, and block by block (blocks of 48
    tokens: several, the last one padded)."""
    if request.param == "blockwise":
        monkeypatch.setattr(route, "DENSE_SCORES_BYTES", 0)
        monkeypatch.setattr(route, "BLOCK", 48)
    return request.param


def window(b, h, q_idx, kv_idx):
    """A local window of 3 keys each side (LTX-2's decoder attends in a window)."""
    return (q_idx - kv_idx).abs() <= 3


def frames(b, h, q_idx, kv_idx):
    """Attention within a frame of 16 tokens (LTX-2's decoder splits its indices so)."""
    return q_idx // 16 == kv_idx // 16


def causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def bias(score, b, h, q_idx, kv_idx):
    return score + 0.1 * h - 0.01 * (q_idx - kv_idx).abs()


@pytest.mark.parametrize("mask_mod, score_mod", [(window, None), (causal, bias),
                                                 (None, bias), (frames, None)])
def test_flex_attention_is_pytorchs(mask_mod, score_mod, way):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 128, 16, generator=gen) for _ in range(3))
    with check.without_accelerator():  # PyTorch's own, on the CPU
        block = None if mask_mod is None else flex.create_block_mask(
            mask_mod, None, None, 128, 128, device="cpu")
        expected, expected_lse = flex.flex_attention(q, k, v, score_mod=score_mod,
                                                     block_mask=block, return_lse=True)
    env = torchax.default_env()
    with env, builtin.BLOCK_MASK.applied(), builtin.FLEX_ATTENTION.applied():
        ours = None if mask_mod is None else flex.create_block_mask(mask_mod, None, None, 128,
                                                                    128, device="jax")
        out, lse = flex.flex_attention(*env.to_xla((q, k, v)), score_mod=score_mod,
                                       block_mask=ours, return_lse=True)
        out, lse = np.asarray(out.jax()), np.asarray(lse.jax())
    assert np.allclose(out, expected.numpy(), atol=2e-5)
    assert np.allclose(lse, expected_lse.numpy(), atol=2e-5)


def test_a_query_with_no_key_gets_zeros(way):
    q = k = v = torch.ones(1, 1, 128, 16)
    env = torchax.default_env()
    with env, builtin.BLOCK_MASK.applied(), builtin.FLEX_ATTENTION.applied():
        block = flex.create_block_mask(lambda b, h, q_idx, kv_idx: q_idx > 0, None, None,
                                       128, 128, device="jax")
        out, lse = flex.flex_attention(*env.to_xla((q, k, v)), block_mask=block,
                                       return_lse=True)
        out, lse = np.asarray(out.jax()), np.asarray(lse.jax())
    assert (out[0, 0, 0] == 0).all() and np.isneginf(lse[0, 0, 0])
    assert np.allclose(out[0, 0, 1:], 1.0)


def test_torchax_alone_cannot_make_the_mask():
    env = torchax.default_env()
    with env, pytest.raises(AttributeError, match="dtype"):
        flex.create_block_mask(frames, None, None, 128, 128, device="jax")


def test_a_module_that_imported_the_function_by_name_gets_the_patch(monkeypatch):
    """AnyFlow-FAR's transformer does ``from torch.nn.attention.flex_attention import
    create_block_mask``: the patch reaches that name too, and is undone after."""
    model = types.ModuleType("some_model")
    model.create_block_mask = flex.create_block_mask
    monkeypatch.setitem(sys.modules, "some_model", model)
    original = flex.create_block_mask
    with builtin.BLOCK_MASK.applied():
        assert model.create_block_mask is flex.create_block_mask is not original
    assert model.create_block_mask is original and flex.create_block_mask is original


def test_a_mask_of_listed_blocks_is_honoured(way):
    """Kandinsky 6's NABLA mask: block tables computed on the device, full blocks (no
    mask_mod) beside partial ones. The tables decide, as in PyTorch's compiled kernel
    (its eager CPU path applies the mask_mod alone, ignoring the tables). Head 0: query
    block 0 sees key block 0; block 1 sees key block 1, and block 0 where the window
    allows. Head 1: query block 0 sees block 0 where the window allows; block 1 all."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 128, 16, generator=gen) for _ in range(3))
    full_counts = torch.tensor([[[1, 1], [0, 2]]], dtype=torch.int32)
    full_indices = torch.tensor([[[[0, 1], [1, 0]], [[0, 1], [0, 1]]]], dtype=torch.int32)
    partial_counts = torch.tensor([[[0, 1], [1, 0]]], dtype=torch.int32)
    partial_indices = torch.tensor([[[[1, 0], [0, 1]], [[0, 1], [0, 1]]]], dtype=torch.int32)

    def near(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= 70

    keep = torch.zeros(2, 128, 128, dtype=torch.bool)
    rows, columns = torch.arange(128)[:, None], torch.arange(128)[None, :]
    for head in range(2):
        for block in range(2):
            tile = slice(block * 64, block * 64 + 64)
            for j in range(int(full_counts[0, head, block])):
                key = int(full_indices[0, head, block, j])
                keep[head, tile, key * 64:key * 64 + 64] = True
            for j in range(int(partial_counts[0, head, block])):
                key = int(partial_indices[0, head, block, j])
                keep[head, tile, key * 64:key * 64 + 64] |= \
                    near(0, head, rows, columns)[tile, key * 64:key * 64 + 64]
    scores = (q @ k.transpose(-1, -2) / 4).masked_fill(~keep, float("-inf"))
    expected = torch.softmax(scores, -1) @ v

    env = torchax.default_env()
    with env, builtin.FLEX_ATTENTION.applied():
        tables = env.to_xla((partial_counts, partial_indices, full_counts, full_indices))
        mask = flex.BlockMask.from_kv_blocks(*tables, BLOCK_SIZE=64, mask_mod=near,
                                             seq_lengths=(128, 128))
        out = np.asarray(flex.flex_attention(*env.to_xla((q, k, v)), block_mask=mask).jax())
    assert np.allclose(out, expected.numpy(), atol=2e-5)


def test_grouped_heads_a_scale_and_auxiliary_outputs_are_pytorchs(way):
    """Two query heads per key head (enable_gqa), a given scale, 256 tokens in blocks of
    128 (PyTorch's own mask skips a block there), and return_aux's log-sum-exp."""
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 256, 16, generator=gen)
    k, v = (torch.randn(1, 2, 256, 16, generator=gen) for _ in range(2))
    aux = flex.AuxRequest(lse=True)
    with check.without_accelerator():
        mask = flex.create_block_mask(causal, None, None, 256, 256, device="cpu")
        expected, expected_aux = flex.flex_attention(q, k, v, block_mask=mask, scale=0.3,
                                                     enable_gqa=True, return_aux=aux)
    env = torchax.default_env()
    with env, builtin.BLOCK_MASK.applied(), builtin.FLEX_ATTENTION.applied():
        mask = flex.create_block_mask(causal, None, None, 256, 256, device="jax")
        out, out_aux = flex.flex_attention(*env.to_xla((q, k, v)), block_mask=mask, scale=0.3,
                                           enable_gqa=True, return_aux=aux)
        out, lse = np.asarray(out.jax()), np.asarray(out_aux.lse.jax())
    assert out_aux.max_scores is None
    assert np.allclose(out, expected.numpy(), atol=2e-5)
    assert np.allclose(lse, expected_aux.lse.numpy(), atol=2e-5)


def test_values_of_another_width_are_pytorchs(way):
    """Flex attention lets the values' width differ from the queries' (32 against 16)."""
    gen = torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, 2, 128, 16, generator=gen) for _ in range(2))
    v = torch.randn(1, 2, 128, 32, generator=gen)
    with check.without_accelerator():
        mask = flex.create_block_mask(causal, None, None, 128, 128, device="cpu")
        expected = flex.flex_attention(q, k, v, block_mask=mask)
    env = torchax.default_env()
    with env, builtin.BLOCK_MASK.applied(), builtin.FLEX_ATTENTION.applied():
        mask = flex.create_block_mask(causal, None, None, 128, 128, device="jax")
        out = np.asarray(flex.flex_attention(*env.to_xla((q, k, v)), block_mask=mask).jax())
    assert out.shape == (1, 2, 128, 32)
    assert np.allclose(out, expected.numpy(), atol=2e-5)


def test_a_mask_made_for_other_lengths_is_refused_as_pytorch_refuses_it():
    q = k = v = torch.ones(1, 1, 256, 16)
    env = torchax.default_env()
    with env, builtin.BLOCK_MASK.applied(), builtin.FLEX_ATTENTION.applied():
        mask = flex.create_block_mask(causal, None, None, 128, 128, device="jax")
        with pytest.raises(ValueError, match="q_len=256 and kv_len=256"):
            flex.flex_attention(*env.to_xla((q, k, v)), block_mask=mask)


def test_a_long_call_is_walked_in_blocks_in_a_blocks_memory(monkeypatch):
    """Over ``DENSE_SCORES_BYTES`` the scores are never all held: 8,192 tokens and two
    heads (512 MiB of float32 scores) compiled both ways for this CPU, with a frame mask
    as Wan-Animate-2's and a score function. Nothing is run: XLA's own count of the
    program's temporaries."""
    import jax
    import jax.numpy as jnp

    interop = torchax.interop
    tokens = 8192

    def attend(q, k, v):
        mask = flex.create_block_mask(frames, None, None, tokens, tokens, device="jax")
        return flex.flex_attention(q, k, v, score_mod=bias, block_mask=mask)

    def temporaries():
        shape = jax.ShapeDtypeStruct((1, 2, tokens, 64), jnp.bfloat16)
        with torchax.default_env(), builtin.BLOCK_MASK.applied(), \
                builtin.FLEX_ATTENTION.applied():
            compiled = jax.jit(interop.jax_view(attend)).lower(shape, shape, shape).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    assert 2 * tokens * tokens * 4 > route.DENSE_SCORES_BYTES
    blockwise = temporaries()
    monkeypatch.setattr(route, "DENSE_SCORES_BYTES", 1 << 40)
    dense = temporaries()
    assert dense > 2 * tokens * tokens * 4  # every score, at least once
    assert blockwise < 64 << 20, (blockwise, dense)


def test_blocks_a_mask_leaves_empty_are_skipped_where_the_mask_is_alike_over_heads(
        monkeypatch):
    """A mask made by ``create_block_mask`` (the same for every batch and head) puts each
    block behind a conditional on whether it keeps any score; tables that differ by head
    (NABLA's, heads split over chips) compute every block."""
    import jax
    import jax.numpy as jnp

    monkeypatch.setattr(route, "DENSE_SCORES_BYTES", 0)
    monkeypatch.setattr(route, "BLOCK", 64)
    shape = jax.ShapeDtypeStruct((1, 2, 128, 16), jnp.float32)

    def primitives(make_mask):
        def attend(q, k, v):
            return flex.flex_attention(q, k, v, block_mask=make_mask())

        with torchax.default_env(), builtin.BLOCK_MASK.applied(), \
                builtin.FLEX_ATTENTION.applied():
            text = str(jax.make_jaxpr(torchax.interop.jax_view(attend))(shape, shape, shape))
        return text

    def alike():
        return flex.create_block_mask(causal, None, None, 128, 128, device="jax")

    def by_head():
        counts = torch.tensor([[[1, 1], [1, 2]]], dtype=torch.int32)
        indices = torch.tensor([[[[0, 1], [1, 0]], [[0, 1], [0, 1]]]], dtype=torch.int32)
        return flex.BlockMask.from_kv_blocks(*torchax.default_env().to_xla((counts, indices)),
                                             BLOCK_SIZE=64, seq_lengths=(128, 128))

    assert " cond[" in primitives(alike)
    assert " cond[" not in primitives(by_head)
