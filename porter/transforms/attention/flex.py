"""Flex attention (``torch.nn.attention.flex_attention``) for a run: the core patch
``core.flex_attention`` (``porter/registry/builtin.py``); its masks are
``porter/shims/flex.py``'s.

``flex_attention`` applies ``score_mod`` and the block mask (``flex.kept``) to every
score and takes the softmax in float32. A query that may attend to no key gets zeros
and a log-sum-exp of -inf, as flex attention gives. Two ways, by size:

- every score at once (``_dense``), up to ``DENSE_SCORES_BYTES`` of float32 scores:
  one fused program, fewer and faster compiles for small calls;
- beyond it (Wan-Animate-2's 42,108 generation tokens against twice as many keys:
  108 GiB a chip at 5 heads), block by block (``_blockwise``): ``BLOCK`` queries at a
  time over ``BLOCK`` keys at a time with an online softmax, the mask and score
  functions evaluated on each block's own indices. Memory grows with the block, not
  the sequence, and a block the mask leaves wholly empty is skipped (a conditional in
  the loop; where the mask differs by batch or head it is computed, then discarded:
  heads split over chips would make the test a collective at every block).
"""

from __future__ import annotations

from porter.shims import lazy
from porter.shims.compat import import_torchax
from porter.shims.flex import kept, listing
from porter.transforms.attention import kernels

torch = lazy.module("torch", __name__)
jax = lazy.module("jax", __name__)
jnp = lazy.module("jax.numpy", __name__)

# Every score at once up to this (float32, batch x heads x queries x keys); block by
# block beyond it.
DENSE_SCORES_BYTES = 1 << 28
BLOCK = 1024
_NO_OP_BLOCK = 1 << 30  # PyTorch's no-op mask (_LARGE_SPARSE_BLOCK_SIZE): any length


def flex_attention(original, **_):
    """``flex_attention`` as attention with the mask's and score's functions: every score
    at once, or block by block where that would be too big (``DENSE_SCORES_BYTES``)."""

    def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                       enable_gqa=False, return_lse=False, kernel_options=None, *,
                       return_aux=None):
        batch, heads, length, width = query.shape
        if enable_gqa and key.shape[1] != heads:
            key = key.repeat_interleave(heads // key.shape[1], dim=1)
            value = value.repeat_interleave(heads // value.shape[1], dim=1)
        scale = width ** -0.5 if scale is None else scale
        _check_lengths(block_mask, length, key.shape[-2])
        attend = _blockwise if _too_big(query, key) else _dense
        out, lse, peak = attend(query, key, value, score_mod, block_mask, scale)
        if return_aux is not None:
            from torch.nn.attention.flex_attention import AuxOutput

            return out, AuxOutput(lse=lse if return_aux.lse else None,
                                  max_scores=peak if return_aux.max_scores else None)
        return (out, lse) if return_lse else out

    flex_attention.__doc__ = f"patched by porter: flex attention (was {original!r})"
    return flex_attention


def _check_lengths(block_mask, length: int, keys: int) -> None:
    """PyTorch's own check: a mask is made for its query and key lengths (``kept`` would
    read another length's blocks from the nearest row or column)."""
    if block_mask is None or block_mask.BLOCK_SIZE == (_NO_OP_BLOCK, _NO_OP_BLOCK):
        return
    if tuple(block_mask.shape[-2:]) != (length, keys):
        raise ValueError(f"block_mask was created for block_mask.shape={block_mask.shape} but "
                         f"got q_len={length} and kv_len={keys}: make the mask for the "
                         "lengths it is used with")


def _too_big(query, key) -> bool:
    """Whether every score at once is over ``DENSE_SCORES_BYTES`` for a call that can be
    walked in blocks: torchax's tensors and views of them (a meta run only needs the
    shapes)."""
    batch, heads, length, _ = query.shape
    scores = batch * heads * length * key.shape[-2] * 4
    return scores > DENSE_SCORES_BYTES and query.device.type == "jax"


def _dense(query, key, value, score_mod, block_mask, scale):
    """(output, log-sum-exp, largest score) from every score at once, in float32."""
    batch, heads, length, _ = query.shape
    keys = key.shape[-2]
    exact = torch.float64 if query.dtype == torch.float64 else torch.float32
    scores = torch.matmul(query.to(exact), key.to(exact).transpose(-2, -1)) * scale
    index = [torch.arange(n, device=query.device).view(*[n if i == axis else 1
                                                        for i in range(4)])
             for axis, n in enumerate((batch, heads, length, keys))]
    if score_mod is not None:
        scores = score_mod(scores, *index)
    if block_mask is not None:
        listed = listing(block_mask, keys, meta=index[2].device.type == "meta")
        scores = torch.where(kept(block_mask, listed, index), scores,
                             torch.tensor(float("-inf"), dtype=exact, device=query.device))
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    out = torch.matmul(weights, value.to(exact)).to(query.dtype)
    return out, lse, scores.amax(dim=-1)


def _blockwise(query, key, value, score_mod, block_mask, scale):
    """(output, log-sum-exp, largest score) walking ``BLOCK`` queries at a time, each
    over ``BLOCK`` keys at a time with an online softmax (``kernels.online_update``);
    the score's and mask's functions see each block's own indices, and a block the
    mask leaves empty is skipped. Scores in float32 from the inputs' dtype, as
    PyTorch's kernel takes them."""
    interop = import_torchax().interop
    batch, heads, length, _ = query.shape
    keys = key.shape[-2]
    listed = None if block_mask is None else listing(block_mask, keys)
    q, k, v = interop.jax_view((query, key, value))
    size_q, size_k = min(BLOCK, length), min(BLOCK, keys)
    q_blocks = kernels.blocks(kernels.pad(q, 2, size_q), size_q)
    k_blocks, v_blocks = (kernels.blocks(kernels.pad(x, 2, size_k), size_k) for x in (k, v))
    b = jnp.arange(batch).reshape(batch, 1, 1, 1)
    h = jnp.arange(heads).reshape(1, heads, 1, 1)

    def kept_here(*index):  # torch's view: the recipe's functions are torch code
        return kept(block_mask, listed, index)

    def modified(scores, *index):
        return scores if score_mod is None else score_mod(scores, *index)

    def one_query_block(inputs):
        q_block, q_start = inputs
        rows = (q_start + jnp.arange(size_q)).reshape(1, 1, size_q, 1)

        def step(carry, inputs):
            k_block, v_block, k_start = inputs
            columns = (k_start + jnp.arange(size_k)).reshape(1, 1, 1, size_k)
            keep = columns < keys  # not the padding
            if block_mask is not None:
                keep = keep & interop.call_torch(kept_here, b, h, rows, columns)

            def attend(carry):
                scores = interop.call_torch(
                    modified, kernels.scaled_scores(q_block, k_block, scale), b, h, rows,
                    columns)
                return kernels.online_update(carry, jnp.where(keep, scores, kernels.NEG_INF),
                                             v_block)

            if block_mask is None or keep.shape[:2] != (1, 1):
                return attend(carry), None
            # A block the mask leaves empty is skipped, not computed and discarded.
            # Only for a mask alike over batch and heads: heads split over chips would
            # make the test a collective at every block.
            return jax.lax.cond(jnp.any(keep), attend, lambda carry: carry, carry), None

        starts = jnp.arange(k_blocks.shape[0]) * size_k
        start = kernels.online_start(q_block, v.shape[-1])
        (peak, total, acc), _ = jax.lax.scan(step, start, (k_blocks, v_blocks, starts))
        return kernels.online_result(total, acc), peak, total

    out, peak, total = jax.lax.map(
        one_query_block, (q_blocks, jnp.arange(q_blocks.shape[0]) * size_q))
    out, peak, total = (kernels.unblocked(x, length) for x in (out, peak, total))
    lse = peak + jnp.log(total)  # -inf where no key is kept
    return interop.torch_view((out.astype(q.dtype), lse, peak))
