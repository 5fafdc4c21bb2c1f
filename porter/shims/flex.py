"""PyTorch's flex attention (``torch.nn.attention.flex_attention``) under torchax.

Flex attention is a higher-order operator that PyTorch compiles into a block-sparse
kernel; torchax cannot lower it, and ``create_block_mask`` evaluates the mask with
``torch.vmap`` over index tensors, which fails on torchax's tensors. Models that
attend through it (LTX-2's diffusion decoder, a 3-D neighbourhood window) stop there.

Both are replaced for a run (core patches ``core.flex_attention`` and
``core.block_mask``, ``porter/registry/builtin.py``) by what they mean, densely:

- ``create_block_mask`` returns a ``BlockMask`` whose every block is partial (its
  ``mask_mod`` decides every score), built from index tables alone: nothing is
  evaluated when the mask is made.
- ``flex_attention`` computes every score, applies ``score_mod`` and ``mask_mod`` to
  broadcast index tensors (batch, head, query, key: what flex attention hands them one
  element at a time), keeps the scores of the mask's listed blocks (full ones whole,
  partial ones where ``mask_mod`` says; a mask built from block tables alone, as
  Kandinsky 6's NABLA builds it on the device, is honoured too), and takes the softmax
  in float32. A query that may attend to no
  key gets zeros and a log-sum-exp of -inf, as flex attention gives.

The block tables decide, as in PyTorch's compiled kernel; PyTorch's eager path (plain
diffusers on a CPU) applies the ``mask_mod`` alone, so a mask of hand-built tables
whose ``mask_mod`` keeps everything (NABLA's) attends everywhere there.

XLA sees one dense program: memory grows with query x key length, where the kernel
skips empty blocks. What a mask leaves out is still computed, then discarded.
"""

from __future__ import annotations

from porter.shims import lazy
from porter.shims.fixes import on_device

torch = lazy.module("torch", __name__)


def dense_block_mask(original, **_):
    """``create_block_mask`` that builds the mask's tables without evaluating it."""

    def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=None, BLOCK_SIZE=128,
                          _compile=False, **_ignored):
        from torch.nn.attention.flex_attention import BlockMask
        from torch.utils._python_dispatch import _disable_current_modes

        q_block, kv_block = (BLOCK_SIZE, BLOCK_SIZE) if isinstance(BLOCK_SIZE, int) \
            else BLOCK_SIZE
        rows, columns = -(-Q_LEN // q_block), -(-KV_LEN // kv_block)
        batch, heads = B or 1, H or 1
        with _disable_current_modes(), torch._C.DisableTorchFunction():  # host tables
            counts = torch.full((batch, heads, rows), columns, dtype=torch.int32)
            indices = torch.arange(columns, dtype=torch.int32).expand(
                batch, heads, rows, columns).contiguous()
            return BlockMask.from_kv_blocks(counts, indices, BLOCK_SIZE=(q_block, kv_block),
                                            mask_mod=mask_mod, seq_lengths=(Q_LEN, KV_LEN))

    create_block_mask.__doc__ = f"patched by porter: a dense block mask (was {original!r})"
    return create_block_mask


def _blocks(counts, indices, columns: int):
    """Which key blocks each query block lists: the first ``counts`` (batch, head, query
    block) of its ``indices`` (..., slot), as (batch, head, query block, key block)
    booleans. Unlisted slots go to a spare last column, which no key reads."""
    slots = torch.arange(indices.shape[-1], device=indices.device)
    target = torch.where(slots < counts[..., None], indices.long(), columns)
    listed = torch.zeros((*indices.shape[:-1], columns + 1), dtype=torch.bool,
                         device=indices.device)
    return listed.scatter(-1, target, True)


def kept(mask, index):
    """The scores a ``BlockMask`` keeps, at every (batch, head, query, key) of the
    broadcast ``index``: the keys of its full blocks, and those of its partial blocks its
    ``mask_mod`` keeps (NABLA's masks are full blocks alone, built from device tensors;
    ``create_block_mask``'s, patched, are partial blocks everywhere)."""

    q_block, kv_block = mask.BLOCK_SIZE
    length, keys = index[2].shape[2], index[3].shape[3]
    tables = (mask.kv_num_blocks, mask.kv_indices, mask.full_kv_num_blocks,
              mask.full_kv_indices)
    if index[2].device.type == "meta":  # shapes only (porter compile's dry run)
        tables = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to("meta"), tables)
    else:
        tables = on_device(tables)
    columns = -(-keys // kv_block)
    rows = torch.arange(length, device=index[2].device) // q_block
    cells = torch.arange(keys, device=index[3].device) // kv_block

    def tokens(blocks):  # block -> token level: (batch, head, query, key)
        return blocks[:, :, rows][..., cells]

    keep = tokens(_blocks(*tables[:2], columns)) & mask.mask_mod(*index)
    if tables[2] is not None:  # full blocks: every key kept
        keep = keep | tokens(_blocks(*tables[2:], columns))
    return keep


def dense_attention(original, **_):
    """``flex_attention`` as dense attention with the mask's and score's functions."""

    def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                       enable_gqa=False, return_lse=False, kernel_options=None, *,
                       return_aux=None):
        batch, heads, length, width = query.shape
        if enable_gqa and key.shape[1] != heads:
            key = key.repeat_interleave(heads // key.shape[1], dim=1)
            value = value.repeat_interleave(heads // value.shape[1], dim=1)
        keys = key.shape[-2]
        scale = width ** -0.5 if scale is None else scale
        exact = torch.float64 if query.dtype == torch.float64 else torch.float32
        scores = torch.matmul(query.to(exact), key.to(exact).transpose(-2, -1)) * scale
        index = [torch.arange(n, device=query.device).view(*[n if i == axis else 1
                                                            for i in range(4)])
                 for axis, n in enumerate((batch, heads, length, keys))]
        if score_mod is not None:
            scores = score_mod(scores, *index)
        if block_mask is not None:
            scores = torch.where(kept(block_mask, index), scores,
                                 torch.tensor(float("-inf"), dtype=exact, device=query.device))
        lse = torch.logsumexp(scores, dim=-1)
        weights = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
        out = torch.matmul(weights, value.to(exact)).to(query.dtype)
        if return_aux is not None:
            from torch.nn.attention.flex_attention import AuxOutput

            return out, AuxOutput(lse=lse if return_aux.lse else None,
                                  max_scores=scores.amax(dim=-1) if return_aux.max_scores
                                  else None)
        return (out, lse) if return_lse else out

    flex_attention.__doc__ = f"patched by porter: dense flex attention (was {original!r})"
    return flex_attention
