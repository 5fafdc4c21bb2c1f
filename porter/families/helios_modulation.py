"""Helios's blocks modulated by the two rows of its per-token timestep embedding.

Helios (``HeliosTransformer3DModel``) denoises a chunk with its history in the same
token sequence, the history at timestep 0 and the chunk at the step's timestep. Its
forward gives every block the timestep embedding per token: the history's row repeated
over the history's tokens, the chunk's over the chunk's, joined (batch, tokens, 6,
width). Each block adds its own ``scale_shift_table`` to that in float32 before taking
its six modulations apart, and the compiler, seeing the table as the only per-block
input, computes every block's sum at once outside the blocks' loop: for Helios 14B at
384x640 (11,040 tokens) a float32 tensor of 11,040 x 6 x 5,120 per block, 0.17 GB a chip
per block written and read again (the largest instruction of a 4-block copy of the
call on v6e-8, with its broadcast about 7% of the call's estimated cycles).

The sums have two distinct rows, so here each block adds its table to those two rows
((batch, 1, 6, width) each) and selects a token's row by its position where the
modulation is applied: the select fuses into the norms and residual sums that read it
and nothing of the tokens' size is written for the modulation. The values are the
model's, bit for bit: the same sums, taken from the same rows.

The rows are read from the embedding's first token (the history's, or the chunk's where
there is no history) and its last (the chunk's), as ``HeliosTransformer3DModel.forward``
builds it in diffusers 0.37-0.42: one row per segment, the chunk's segment the last
``original_context_length`` tokens. A caller that gave a block some other per-token
embedding would not get its modulation; tests/families/test_helios_modulation.py holds
the patched model to the unpatched one through Helios's own pipeline with a history.
"""

from __future__ import annotations

from porter.shims import lazy

torch = lazy.module("torch", __name__)


def rows_of(temb):
    """(batch, 2, 6, width): the history's row (the first token's) and the chunk's (the
    last token's) of a per-token embedding built as the model builds it."""
    return torch.cat([temb[:, :1], temb[:, -1:]], dim=1)


def segment_rows(table, rows, tokens, chunk_tokens):
    """The six modulations a block applies, each (batch, tokens, width) in float32, as a
    select between the history's row and the chunk's: ``table`` the block's (1, 6, width)
    ``scale_shift_table``, ``rows`` from ``rows_of``, the chunk the last
    ``chunk_tokens`` of ``tokens``."""
    history = (table.unsqueeze(0) + rows[:, :1].float()).chunk(6, dim=2)
    chunk = (table.unsqueeze(0) + rows[:, 1:].float()).chunk(6, dim=2)
    in_chunk = (torch.arange(tokens, device=rows.device) >= tokens - chunk_tokens)
    in_chunk = in_chunk.view(1, tokens, 1)
    return [torch.where(in_chunk, c.squeeze(2), h.squeeze(2)) for h, c in zip(history, chunk)]


def scan_inputs(arguments: dict) -> None:
    """Before Porter's scan of the blocks (``porter.transforms.jit.scan``): the two rows
    taken once, outside the loop, and given to every block instead of the per-token
    embedding, which the loop would otherwise take whole (and the compiler write out)."""
    temb = arguments.get("temb")
    if temb is not None and temb.ndim == 4 \
            and arguments.get("original_context_length") is not None:
        arguments["temb_rows"], arguments["temb"] = rows_of(temb), None


def block_forward(original, **_):
    """``HeliosTransformerBlock.forward`` with the per-token modulation taken from its
    two rows (``segment_rows``), given as ``temb_rows`` (by ``scan_inputs``) or read from
    ``temb``; the rest is the model's forward, unchanged."""
    def forward(self, hidden_states, encoder_hidden_states, temb, rotary_emb,
                original_context_length=None, temb_rows=None):
        if temb_rows is None:
            if temb.ndim != 4 or original_context_length is None:
                return original(self, hidden_states, encoder_hidden_states, temb, rotary_emb,
                                original_context_length)
            temb_rows = rows_of(temb)
        shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = segment_rows(
            self.scale_shift_table, temb_rows, hidden_states.shape[1], original_context_length)

        # 1. Self-attention
        norm_hidden_states = (self.norm1(hidden_states.float()) * (1 + scale_msa)
                              + shift_msa).type_as(hidden_states)
        attn_output = self.attn1(norm_hidden_states, None, None, rotary_emb,
                                 original_context_length)
        hidden_states = (hidden_states.float() + attn_output * gate_msa).type_as(hidden_states)

        # 2. Cross-attention (with guidance_cross_attn, the chunk's tokens only)
        if self.guidance_cross_attn:
            history_seq_len = hidden_states.shape[1] - original_context_length
            history_hidden_states, hidden_states = torch.split(
                hidden_states, [history_seq_len, original_context_length], dim=1)
        norm_hidden_states = self.norm2(hidden_states.float()).type_as(hidden_states)
        attn_output = self.attn2(norm_hidden_states, encoder_hidden_states, None, None,
                                 original_context_length)
        hidden_states = hidden_states + attn_output
        if self.guidance_cross_attn:
            hidden_states = torch.cat([history_hidden_states, hidden_states], dim=1)

        # 3. Feed-forward
        norm_hidden_states = (self.norm3(hidden_states.float()) * (1 + c_scale_msa)
                              + c_shift_msa).type_as(hidden_states)
        ff_output = self.ffn(norm_hidden_states)
        return (hidden_states.float() + ff_output.float() * c_gate_msa).type_as(hidden_states)

    forward.__doc__ = f"patched by porter: modulation from two rows (was {original!r})"
    forward.scan_inputs = scan_inputs
    return forward
