"""The original Wan release's VAE and UMT5 text encoder files, made from diffusers' and
transformers' modules: the key names ``Wan2.1_VAE.pth`` and
``models_t5_umt5-xxl-enc-bf16.pth`` use (tests check diffusers' converter and Porter's
map them back)."""

import re

# The Wan 2.1 VAE's layout (dims 1, 2, 4, 4 x base, two residual blocks a stage,
# temporal downsampling in the last two) at a small width: diffusers' converter knows
# only this layout's block numbering.
RELEASE_VAE = dict(base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                   attn_scales=[], temperal_downsample=[False, True, True], dropout=0.0)

_RESIDUAL = {"norm1.gamma": "residual.0.gamma", "conv1.weight": "residual.2.weight",
             "conv1.bias": "residual.2.bias", "norm2.gamma": "residual.3.gamma",
             "conv2.weight": "residual.6.weight", "conv2.bias": "residual.6.bias",
             "conv_shortcut.weight": "shortcut.weight", "conv_shortcut.bias": "shortcut.bias"}
_FIXED = {"quant_conv": "conv1", "post_quant_conv": "conv2",
          "encoder.conv_in": "encoder.conv1", "decoder.conv_in": "decoder.conv1",
          "encoder.norm_out": "encoder.head.0", "encoder.conv_out": "encoder.head.2",
          "decoder.norm_out": "decoder.head.0", "decoder.conv_out": "decoder.head.2",
          "encoder.mid_block.attentions.0": "encoder.middle.1",
          "decoder.mid_block.attentions.0": "decoder.middle.1"}


def wan_vae_names(state: dict) -> dict:
    """A diffusers ``AutoencoderKLWan`` state dict (``RELEASE_VAE``'s layout) under the
    original release's names."""
    return {_vae_name(name): tensor for name, tensor in state.items()}


def _vae_name(name: str) -> str:
    for ours, theirs in _FIXED.items():
        if name.startswith(ours + "."):
            return theirs + name[len(ours):]
    match = re.fullmatch(r"(encoder|decoder)\.mid_block\.resnets\.(\d)\.(.+)", name)
    if match:
        side, index, rest = match.groups()
        return f"{side}.middle.{2 * int(index)}.{_RESIDUAL[rest]}"
    match = re.fullmatch(r"encoder\.down_blocks\.(\d+)\.(.+)", name)
    if match:
        return f"encoder.downsamples.{match.group(1)}.{_RESIDUAL.get(match.group(2), match.group(2))}"
    match = re.fullmatch(r"decoder\.up_blocks\.(\d)\.resnets\.(\d)\.(.+)", name)
    if match:
        block, resnet, rest = (int(match.group(1)), int(match.group(2)), match.group(3))
        return f"decoder.upsamples.{4 * block + resnet}.{_RESIDUAL[rest]}"
    match = re.fullmatch(r"decoder\.up_blocks\.(\d)\.upsamplers\.0\.(.+)", name)
    if match:
        return f"decoder.upsamples.{4 * int(match.group(1)) + 3}.{match.group(2)}"
    raise ValueError(f"no original name known for {name}")


# transformers' name in an encoder block -> the release's (written out from Wan's
# wan/modules/t5.py, not from porter_wan.umt5's map, which the tests check against it)
_UMT5_BLOCK = {
    "layer.0.layer_norm.weight": "norm1.weight",
    "layer.0.SelfAttention.q.weight": "attn.q.weight",
    "layer.0.SelfAttention.k.weight": "attn.k.weight",
    "layer.0.SelfAttention.v.weight": "attn.v.weight",
    "layer.0.SelfAttention.o.weight": "attn.o.weight",
    "layer.0.SelfAttention.relative_attention_bias.weight": "pos_embedding.embedding.weight",
    "layer.1.layer_norm.weight": "norm2.weight",
    # Wan: fc2(fc1(x) * gelu(gate(x))); transformers: wo(gelu(wi_0(x)) * wi_1(x))
    "layer.1.DenseReluDense.wi_0.weight": "ffn.gate.0.weight",
    "layer.1.DenseReluDense.wi_1.weight": "ffn.fc1.weight",
    "layer.1.DenseReluDense.wo.weight": "ffn.fc2.weight",
}


def wan_umt5_names(state: dict) -> dict:
    """A transformers ``UMT5EncoderModel`` state dict under the original release's names
    (the tied embedding once, as ``token_embedding``)."""
    out = {}
    for name, tensor in state.items():
        if name == "encoder.embed_tokens.weight":
            continue  # the same tensor as shared.weight
        if name == "shared.weight":
            out["token_embedding.weight"] = tensor
        elif name == "encoder.final_layer_norm.weight":
            out["norm.weight"] = tensor
        else:
            index, rest = re.fullmatch(r"encoder\.block\.(\d+)\.(.+)", name).groups()
            out[f"blocks.{index}.{_UMT5_BLOCK[rest]}"] = tensor
    return out
