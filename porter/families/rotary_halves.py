"""Queries and keys rotated with each pair's two parts kept apart: Wan's, SkyReels-V2's
and Helios's self-attention, the same scores, a fraction of the TPU's work.

Wan's attention (``WanAttnProcessor``, which SkyReels-V2, ChronoEdit and Wan-Animate
copy) and Helios's (``apply_rotary_emb_transposed``) rotate the queries and keys by
position as pairs of neighbouring channels, and write each rotated pair back interleaved
(``out[..., 0::2] = ...; out[..., 1::2] = ...``). Porter's strided assignment
(``porter.shims.setitem``) broadcasts each half into place and selects, and the TPU
compiler's own estimate puts those broadcasts at a quarter of a Wan 14B block's
cycles at 480p on v6e-8. The rotated queries and keys meet only in attention's
scores, sums over the channels of a head: any order of a head's channels gives the
same scores if queries and keys share it. So here each head's channels come out as
all the pairs' first parts, then all their second parts: two products and a
concatenation, which fuse with the arithmetic around them. The values are not rotated
and keep their order, so attention's output is the model's. Scores differ from the
interleaved ones only by the order of a float sum.
"""

from __future__ import annotations

from importlib import import_module

from porter.shims import lazy

torch = lazy.module("torch", __name__)


def rotated(x, cos, sin):
    """``x`` (..., head width) rotated as the models rotate it, each head's channels in
    halves order (every pair's first part, then every second). ``cos`` and ``sin``: the
    models' tables, each value repeated for a pair's two channels (the first channel's
    cosine and the second's sine are read, as the models read them)."""
    first, second = x[..., 0::2], x[..., 1::2]
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    # each half cast as it is made (as the models cast their output), so the join
    # holds the tensor's own dtype, not the tables' float32
    return torch.cat([(first * cos - second * sin).type_as(x),
                      (first * sin + second * cos).type_as(x)], dim=-1)


def wan_processor(original, **_):
    """``WanAttnProcessor.__call__`` (or a copy of it: SkyReels-V2's processor) with its
    self-attention's queries and keys rotated in halves order (``rotated``), through the
    helpers of the processor's own module; diffusers' own code otherwise
    (cross-attention, which has no rotation, and image-to-video's image keys, which the
    queries also meet). A diffusers without those helpers (before 0.36: no
    ``parallel_config``) keeps its processor as it is."""
    import inspect

    model = import_module(original.__module__)
    dispatch = getattr(model, "dispatch_attention_fn", None)
    if not hasattr(model, "_get_qkv_projections") or dispatch is None \
            or "parallel_config" not in inspect.signature(dispatch).parameters:
        return original

    def __call__(self, attn, hidden_states, encoder_hidden_states=None,
                 attention_mask=None, rotary_emb=None):
        if rotary_emb is None or encoder_hidden_states is not None \
                or attn.add_k_proj is not None:
            return original(self, attn, hidden_states, encoder_hidden_states,
                            attention_mask, rotary_emb)
        # the module's helpers as the call finds them (as diffusers' code does)
        query, key, value = model._get_qkv_projections(attn, hidden_states, None)
        query, key = attn.norm_q(query), attn.norm_k(key)
        query, key, value = (t.unflatten(2, (attn.heads, -1)) for t in (query, key, value))
        query, key = (rotated(t, *rotary_emb) for t in (query, key))
        out = model.dispatch_attention_fn(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
            backend=self._attention_backend, parallel_config=self._parallel_config)
        out = out.flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))

    __call__.__doc__ = f"patched by porter: rotation in halves order (was {original!r})"
    return __call__


def helios_rotation(original, **_):
    """Helios's ``apply_rotary_emb_transposed`` (its processor's only rotation, of the
    queries and keys it then attends with) in halves order."""
    def apply_rotary_emb_transposed(hidden_states, freqs_cis):
        cos, sin = freqs_cis.unsqueeze(-2).chunk(2, dim=-1)
        return rotated(hidden_states, cos, sin)

    apply_rotary_emb_transposed.__doc__ = (
        f"patched by porter: rotation in halves order (was {original!r})")
    return apply_rotary_emb_transposed
