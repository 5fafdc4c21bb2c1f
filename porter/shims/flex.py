"""PyTorch's flex attention (``torch.nn.attention.flex_attention``) under torchax: its
masks.

Flex attention is a higher-order operator that PyTorch compiles into a block-sparse
kernel; torchax cannot lower it, and ``create_block_mask`` evaluates the mask with
``torch.vmap`` over index tensors, which fails on torchax's tensors. Models that
attend through it (LTX-2's diffusion decoder, a 3-D neighbourhood window,
Wan-Animate-2's reference mask) stop there.

Both are replaced for a run (core patches ``core.block_mask`` and
``core.flex_attention``, ``porter/registry/builtin.py``); the mask's side is here:

- ``create_block_mask`` returns a ``BlockMask`` whose every block is partial (its
  ``mask_mod`` decides every score), built from index tables alone: nothing is
  evaluated when the mask is made.
- ``kept`` says which scores a mask keeps at broadcast index tensors (batch, head,
  query, key: what flex attention hands ``mask_mod`` one element at a time): the
  mask's listed blocks (full ones whole, partial ones where ``mask_mod`` says; a mask
  built from block tables alone, as Kandinsky 6's NABLA builds it on the device, is
  honoured too).

The block tables decide, as in PyTorch's compiled kernel; PyTorch's eager path (plain
diffusers on a CPU) applies the ``mask_mod`` alone, so a mask of hand-built tables
whose ``mask_mod`` keeps everything (NABLA's) attends everywhere there. The attention
itself is ``porter/transforms/attention/flex.py``.
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


def listing(mask, keys: int, meta: bool = False):
    """The key blocks a ``BlockMask`` lists for each query block, as (batch, head, query
    block, key block + a spare) booleans: its partial blocks' and its full blocks' (None
    when it has none). ``meta``: shapes only (porter compile's dry run)."""
    tables = (mask.kv_num_blocks, mask.kv_indices, mask.full_kv_num_blocks,
              mask.full_kv_indices)
    if meta:
        tables = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to("meta"), tables)
    else:
        tables = on_device(tables)
    columns = -(-keys // mask.BLOCK_SIZE[1])
    full = None if tables[2] is None else _blocks(*tables[2:], columns)
    return _blocks(*tables[:2], columns), full


def kept(mask, listed, index):
    """The scores a ``BlockMask`` keeps, at every (batch, head, query, key) of the
    broadcast ``index`` (any stretch of queries and keys): the keys of its full blocks,
    and those of its partial blocks its ``mask_mod`` keeps (NABLA's masks are full
    blocks alone, built from device tensors; ``create_block_mask``'s, patched, are
    partial blocks everywhere). ``listed``: the mask's ``listing``."""

    q_block, kv_block = mask.BLOCK_SIZE
    partial, full = listed
    rows = torch.clamp(index[2].reshape(-1) // q_block, max=partial.shape[2] - 1)
    cells = torch.clamp(index[3].reshape(-1) // kv_block, max=partial.shape[3] - 1)

    def tokens(blocks):  # block -> token level: (batch, head, query, key)
        return blocks[:, :, rows][..., cells]

    keep = tokens(partial) & mask.mask_mod(*index)
    if full is not None:  # full blocks: every key kept
        keep = keep | tokens(full)
    return keep
