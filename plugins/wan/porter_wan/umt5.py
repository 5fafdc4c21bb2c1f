"""The original Wan release's UMT5 text encoder (``models_t5_umt5-xxl-enc-bf16.pth``)
in transformers' names (``UMT5EncoderModel``), for ``model.text_encoder``.

Wan's encoder (its ``wan/modules/t5.py``) is T5's with its own names: per block
``norm1``, ``attn.{q,k,v,o}``, ``pos_embedding.embedding`` (UMT5: a relative position
table in every block), ``norm2``, ``ffn.gate.0`` (the GELU branch), ``ffn.fc1``,
``ffn.fc2``; ``token_embedding`` and the final ``norm`` outside them. Its feed-forward
computes ``fc2(fc1(x) * gelu(gate(x)))``, transformers' ``wo(gelu(wi_0(x)) * wi_1(x))``:
so ``gate.0`` is ``wi_0`` and ``fc1`` is ``wi_1``. A pure renaming: every tensor is
read as the file holds it, straight into its shards.
"""

from __future__ import annotations

import re

#: Wan's name in a block -> transformers' (``{i}``: the block)
BLOCK = {
    "norm1.weight": "layer.0.layer_norm.weight",
    "attn.q.weight": "layer.0.SelfAttention.q.weight",
    "attn.k.weight": "layer.0.SelfAttention.k.weight",
    "attn.v.weight": "layer.0.SelfAttention.v.weight",
    "attn.o.weight": "layer.0.SelfAttention.o.weight",
    "pos_embedding.embedding.weight": "layer.0.SelfAttention.relative_attention_bias.weight",
    "norm2.weight": "layer.1.layer_norm.weight",
    "ffn.gate.0.weight": "layer.1.DenseReluDense.wi_0.weight",
    "ffn.fc1.weight": "layer.1.DenseReluDense.wi_1.weight",
    "ffn.fc2.weight": "layer.1.DenseReluDense.wo.weight",
}
#: outside the blocks; the token embedding is also the encoder's (tied: one tensor)
OUTSIDE = {"token_embedding.weight": ("shared.weight", "encoder.embed_tokens.weight"),
           "norm.weight": ("encoder.final_layer_norm.weight",)}
_BLOCK_NAME = re.compile(r"blocks\.(\d+)\.(.+)")


def from_wan_names(checkpoint: dict) -> dict:
    """``{Wan's name: tensor}`` -> ``{transformers' name: the same tensor}``. A name it
    does not know is kept as it is (and then reported as not the model's)."""
    converted = {}
    for name, tensor in checkpoint.items():
        if name in OUTSIDE:
            converted.update({target: tensor for target in OUTSIDE[name]})
            continue
        match = _BLOCK_NAME.fullmatch(name)
        if match and match.group(2) in BLOCK:
            converted[f"encoder.block.{match.group(1)}.{BLOCK[match.group(2)]}"] = tensor
        else:
            converted[name] = tensor
    return converted
