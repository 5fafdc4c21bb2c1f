"""HunyuanVideo 1.5's transformer as one compiled program that fits a chip: its
forward without value-dependent Python (``traceable_forward``), its attention with a
key mask instead of a square one (``key_mask_attention``).

diffusers' forward does two things a tracer cannot: ``if torch.all(image_embeds == 0):``
(text-to-video zeroes the image tokens and masks them out) and a loop over the batch
that reorders each sequence's text tokens with boolean indexing (valid tokens first:
image, glyph, text; then the invalid ones in the same order, glyph and text zeroed).
Here the branch is a ``torch.where`` and the reordering a gather by a sort key (the
invalid flag, then the position): the same tokens in the same order, of fixed shapes.
Everything else is diffusers' code as written.
"""

from __future__ import annotations

from porter.shims import lazy

torch = lazy.module("torch", __name__)


def valid_first(parts: list, masks: list, zeroed: list) -> tuple:
    """diffusers' reordering of text tokens, for a batch at once: ``parts`` (batch,
    tokens_i, width) and their boolean ``masks`` (batch, tokens_i) concatenated with
    each sequence's valid tokens first and its invalid ones after, each group in the
    parts' order; a part whose ``zeroed`` is true has its invalid tokens zeroed.
    (tokens, mask) of (batch, sum tokens_i, width) and (batch, sum tokens_i)."""
    tokens = torch.cat([torch.where(mask[..., None], part, torch.zeros_like(part)) if zero
                        else part for part, mask, zero in zip(parts, masks, zeroed)], dim=1)
    mask = torch.cat(masks, dim=1)
    length = mask.shape[1]
    # unique keys: the order does not depend on the sort being stable
    key = (~mask).to(torch.int32) * length + torch.arange(length, device=mask.device,
                                                          dtype=torch.int32)
    order = torch.argsort(key, dim=1)
    tokens = torch.gather(tokens, 1, order[..., None].expand(-1, -1, tokens.shape[-1]))
    return tokens, torch.gather(mask, 1, order)


def traceable_forward(original, **_):
    """``HunyuanVideo15Transformer3DModel.forward`` with the branch and the reordering
    above; LoRA scaling kept (diffusers' own decorator)."""
    from diffusers.models.modeling_outputs import Transformer2DModelOutput
    from diffusers.utils import apply_lora_scale

    @apply_lora_scale("attention_kwargs")
    def forward(self, hidden_states, timestep, encoder_hidden_states, encoder_attention_mask,
                timestep_r=None, encoder_hidden_states_2=None, encoder_attention_mask_2=None,
                image_embeds=None, attention_kwargs=None, return_dict: bool = True):
        batch_size, _, num_frames, height, width = hidden_states.shape
        p_t, p_h, p_w = self.config.patch_size_t, self.config.patch_size, self.config.patch_size

        image_rotary_emb = self.rope(hidden_states)
        temb = self.time_embed(timestep, timestep_r=timestep_r)
        hidden_states = self.x_embedder(hidden_states)

        text = self.context_embedder(encoder_hidden_states, timestep, encoder_attention_mask)
        text = text + self.cond_type_embed(torch.zeros_like(text[:, :, 0], dtype=torch.long))
        glyph = self.context_embedder_2(encoder_hidden_states_2)
        glyph = glyph + self.cond_type_embed(torch.ones_like(glyph[:, :, 0], dtype=torch.long))

        image = self.image_embedder(image_embeds)
        # text-to-video passes zero image embeddings: those tokens zeroed and masked out
        is_t2v = torch.all(image_embeds == 0)
        image = torch.where(is_t2v, image * 0.0, image)
        image_mask = (~is_t2v).expand(batch_size, image.shape[1])
        image = image + self.cond_type_embed(2 * torch.ones_like(image[:, :, 0],
                                                                 dtype=torch.long))

        tokens, mask = valid_first(
            [image, glyph, text],
            [image_mask, encoder_attention_mask_2.bool(), encoder_attention_mask.bool()],
            zeroed=[False, True, True])

        checkpointed = torch.is_grad_enabled() and self.gradient_checkpointing  # training
        for block in self.transformer_blocks:
            call = (lambda *a, b=block: self._gradient_checkpointing_func(b, *a)) \
                if checkpointed else block
            hidden_states, tokens = call(hidden_states, tokens, temb, mask, image_rotary_emb)

        hidden_states = self.norm_out(hidden_states, temb)
        hidden_states = self.proj_out(hidden_states)
        hidden_states = hidden_states.reshape(batch_size, num_frames // p_t, height // p_h,
                                              width // p_w, -1, p_t, p_h, p_w)
        hidden_states = hidden_states.permute(0, 4, 1, 5, 2, 6, 3, 7)
        hidden_states = hidden_states.flatten(6, 7).flatten(4, 5).flatten(2, 3)
        if not return_dict:
            return (hidden_states,)
        return Transformer2DModelOutput(sample=hidden_states)

    forward.__doc__ = f"patched by porter: no value-dependent Python (was {original!r})"
    return forward


def key_mask_attention(original, **_):
    """``HunyuanVideo15AttnProcessor2_0.__call__`` with the text padding given to
    attention as a key mask (batch, 1, 1, tokens), not diffusers' square mask.

    diffusers builds ``mask[:, None] & mask[None, :]``: tokens x tokens booleans, 12.9 GB
    per chip at 720p and 121 frames (113,585 tokens), and a mask no kernel can read as
    padding (splash falls back to blockwise, with the matrix). The two differ only in
    the rows of padding queries, which the square mask empties and the key mask does
    not: those rows are text padding tokens, which every later attention masks out as
    keys and the output drops, so the video is the same."""
    import torch.nn.functional as F
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.embeddings import apply_rotary_emb

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        query, key, value = (attn.to_q(hidden_states), attn.to_k(hidden_states),
                             attn.to_v(hidden_states))
        query, key, value = (t.unflatten(2, (attn.heads, -1)) for t in (query, key, value))
        query, key = attn.norm_q(query), attn.norm_k(key)
        if image_rotary_emb is not None:
            query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
            key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)
        if encoder_hidden_states is not None:
            text = [proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
                    for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)]
            if attn.norm_added_q is not None:
                text[0] = attn.norm_added_q(text[0])
            if attn.norm_added_k is not None:
                text[1] = attn.norm_added_k(text[1])
            query, key, value = (torch.cat([video, words], dim=1)
                                 for video, words in zip((query, key, value), text))

        batch_size, seq_len = query.shape[:2]
        keys = F.pad(attention_mask, (seq_len - attention_mask.shape[1], 0), value=True)
        hidden_states = dispatch_attention_fn(
            query, key, value, attn_mask=keys.bool().view(batch_size, 1, 1, seq_len),
            dropout_p=0.0, is_causal=False, backend=self._attention_backend,
            parallel_config=self._parallel_config)
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)

        if encoder_hidden_states is not None:
            text_len = encoder_hidden_states.shape[1]
            hidden_states, encoder_hidden_states = (hidden_states[:, :-text_len],
                                                    hidden_states[:, -text_len:])
            if getattr(attn, "to_out", None) is not None:
                hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
            if getattr(attn, "to_add_out", None) is not None:
                encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        return hidden_states, encoder_hidden_states

    __call__.__doc__ = f"patched by porter: a key mask, not a square one (was {original!r})"
    return __call__
