"""Single-file transformers as users hold them, made from a diffusers state dict: the
original Wan release's key names, fp8 cast, and ComfyUI's scaled fp8."""

import torch

# diffusers' name piece -> Wan's own, the inverse of diffusers'
# convert_wan_transformer_to_diffusers for a text-to-video model (tests check it is)
TO_WAN = [("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
          ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
          ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
          ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
          ("condition_embedder.time_proj", "time_projection.1"),
          ("attn1", "self_attn"), ("attn2", "cross_attn"), (".to_out.0.", ".o."),
          (".to_q.", ".q."), (".to_k.", ".k."), (".to_v.", ".v."),
          ("ffn.net.0.proj", "ffn.0"), ("ffn.net.2", "ffn.2"), ("proj_out", "head.head")]


def wan_names(state: dict) -> dict:
    """``state`` under the original Wan release's key names."""
    out = {}
    for name, tensor in state.items():
        new = name
        for ours, theirs in TO_WAN:
            new = new.replace(ours, theirs)
        if new == "scale_shift_table":
            new = "head.modulation"
        new = new.replace("scale_shift_table", "modulation")
        new = new.replace("norm2", "norm_swap").replace("norm3", "norm2") \
            .replace("norm_swap", "norm3")
        out["model.diffusion_model." + new] = tensor
    return out


def fp8(state: dict, scaled: bool, rows: bool = False) -> dict:
    """Every 2-D weight in float8 e4m3: cast as it is (``scaled`` False), or scaled to
    fit with a ``scale_weight`` beside it (one, or ``rows``: one a row, shaped (rows,
    1)) and the ``scaled_fp8`` marker."""
    out = {}
    for name, tensor in state.items():
        if tensor.dim() != 2 or not name.endswith("weight"):
            out[name] = tensor
            continue
        wide = tensor.float().abs()
        scale = (wide.amax(1, keepdim=True) if rows else wide.max()) / 448 if scaled \
            else torch.tensor(1.0)
        scale = scale.clamp(min=1e-12)
        out[name] = (tensor.float() / scale).to(torch.float8_e4m3fn)
        if scaled:
            out[name[:-len("weight")] + "scale_weight"] = scale if rows else scale.reshape(())
    if scaled:
        out["scaled_fp8"] = torch.zeros(2, dtype=torch.float8_e4m3fn)
    return out


def dequantized(state: dict) -> dict:
    """What a file made by ``fp8`` holds, as values: each weight times its scale."""
    return {name: tensor.float() * state.get(name[:-len("weight")] + "scale_weight",
                                             torch.tensor(1.0)).float()
            for name, tensor in state.items()
            if not name.endswith("scale_weight") and name != "scaled_fp8"}
