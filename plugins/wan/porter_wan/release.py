"""The original Wan 2.1 text-to-video release folder (``Wan-AI/Wan2.1-T2V-1.3B``,
``-14B``), as it is published: Wan's own ``config.json``, the transformer in Wan's key
names (``diffusion_pytorch_model.safetensors``, or shards with their index), the VAE
``Wan2.1_VAE.pth``, the UMT5 encoder ``models_t5_umt5-xxl-enc-bf16.pth`` and the
tokenizer folder ``google/umt5-xxl``.

What diffusers' configurations need and Wan's ``config.json`` does not say is read
from the weight files' headers (the text width, the VAE's base width, the encoder's
sizes), so a folder of any size is described as it is. The scheduler is the one
diffusers' Wan repositories ship (UniPC, flow matching, shift 3.0); a recipe's
``scheduler:`` section sets it otherwise.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from porter.errors import UsageError
from porter.loading import single_file
from porter_wan.configs import UMT5_XXL, WAN_VAE

TRANSFORMER_FILES = ("diffusion_pytorch_model.safetensors",
                     "diffusion_pytorch_model.safetensors.index.json")
VAE_FILE = "Wan2.1_VAE.pth"
TEXT_ENCODER_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
TOKENIZER = Path("google") / "umt5-xxl"
SCHEDULER = ("UniPCMultistepScheduler", {
    "num_train_timesteps": 1000, "beta_start": 0.0001, "beta_end": 0.02,
    "beta_schedule": "linear", "solver_order": 2, "prediction_type": "flow_prediction",
    "thresholding": False, "predict_x0": True, "solver_type": "bh2",
    "lower_order_final": True, "disable_corrector": [], "timestep_spacing": "linspace",
    "steps_offset": 0, "final_sigmas_type": "zero", "use_flow_sigmas": True,
    "flow_shift": 3.0})


def describe(folder: Path) -> dict | None:
    """``ModelFamily.release``'s answer for a Wan release folder; None for a folder that
    is not one (no Wan ``config.json``); UsageError for one that lacks a file."""
    config_file = folder / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or config.get("_class_name") != "WanModel":
        return None
    kind = config.get("model_type", "t2v")
    if kind != "t2v":
        raise UsageError(f"{folder}: a Wan release of model_type {kind!r}; Porter reads "
                         "text-to-video release folders (t2v)",
                         hint="use the model's diffusers repository (…-Diffusers) as "
                              "model.source")
    files = {"transformer": next((folder / name for name in TRANSFORMER_FILES
                                  if (folder / name).is_file()), None),
             "vae": folder / VAE_FILE, "text_encoder": folder / TEXT_ENCODER_FILE}
    missing = [name for name, path in files.items() if path is None or not path.is_file()]
    if not (folder / TOKENIZER).is_dir():
        missing.append(str(TOKENIZER))
    if missing:
        raise UsageError(f"{folder}: a Wan release folder without {', '.join(missing)}",
                         hint=f"the release holds {TRANSFORMER_FILES[0]} (or its shards), "
                              f"{VAE_FILE}, {TEXT_ENCODER_FILE} and {TOKENIZER}/")
    headers = {name: single_file.read_header(path) for name, path in files.items()}
    return {"pipeline": "WanPipeline",
            "configs": {"transformer": _transformer(config, headers["transformer"]),
                        "vae": _vae(headers["vae"]),
                        "text_encoder": _umt5(headers["text_encoder"])},
            "scheduler": SCHEDULER, "tokenizer": folder / TOKENIZER, "files": files}


def _shape(header: dict, name: str) -> tuple:
    entry = header.get(name) or header.get("model.diffusion_model." + name)
    if entry is None:
        raise UsageError(f"the release's weights lack {name}", hint="is the file whole?")
    return tuple(entry.shape)


def _transformer(config: dict, header: dict):
    dim, heads = int(config["dim"]), int(config["num_heads"])
    return ("diffusers", "WanTransformer3DModel", {
        "patch_size": [1, 2, 2], "num_attention_heads": heads,
        "attention_head_dim": dim // heads, "in_channels": int(config["in_dim"]),
        "out_channels": int(config["out_dim"]),
        "text_dim": _shape(header, "text_embedding.0.weight")[1],
        "freq_dim": int(config["freq_dim"]), "ffn_dim": int(config["ffn_dim"]),
        "num_layers": int(config["num_layers"]), "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads", "eps": float(config.get("eps", 1e-6)),
        "rope_max_seq_len": 1024})


def _vae(header: dict):
    library, cls, settings = WAN_VAE
    return (library, cls, {**settings, "base_dim": _shape(header, "encoder.conv1.weight")[0],
                           "z_dim": _shape(header, "conv1.weight")[0] // 2})


def _umt5(header: dict):
    library, cls, settings = UMT5_XXL
    vocab, width = _shape(header, "token_embedding.weight")
    inner = _shape(header, "blocks.0.attn.q.weight")[0]
    buckets, heads = _shape(header, "blocks.0.pos_embedding.embedding.weight")
    layers = 1 + max(int(m.group(1)) for name in header
                     if (m := re.match(r"blocks\.(\d+)\.", name)))
    return (library, cls, {**settings, "vocab_size": vocab, "d_model": width,
                           "d_kv": inner // heads, "num_heads": heads,
                           "d_ff": _shape(header, "blocks.0.ffn.fc1.weight")[0],
                           "num_layers": layers, "relative_attention_num_buckets": buckets})
