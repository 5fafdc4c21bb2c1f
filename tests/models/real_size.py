"""Real-size checkpoints with random weights, written as diffusers writes them.

Loading, sharding and memory are only proven at the sizes users run. Weights
cannot be downloaded here, but the published configurations are public facts
the plugins ship (``official_configs``): the transformer and the VAE are built
from them exactly, filled with random values and saved with
``save_pretrained(max_shard_size=...)`` into an indexed, sharded directory.

The text encoder is the one exception: UMT5-XXL / T5-XXL (4.7-5.7B parameters,
10-11 GiB in bfloat16) replicated over a data axis would not fit in this
machine's memory beside everything else, so it keeps the real width (4096,
which the transformer's text projection reads) with one layer and a byte-level
vocabulary. Tokenizer and scheduler come from the family's tiny pipeline.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
# family -> (hub id whose official configs are used, reduced text encoder config)
LAYOUTS = {
    "wan": ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
            dict(vocab_size=384, d_model=4096, d_kv=64, d_ff=512, num_layers=1, num_heads=8,
                 relative_attention_num_buckets=32, feed_forward_proj="gated-gelu")),
    "cogvideox": ("THUDM/CogVideoX-2b",
                  dict(vocab_size=384, d_model=4096, d_kv=64, d_ff=512, num_layers=1,
                       num_heads=8, relative_attention_num_buckets=32,
                       feed_forward_proj="gated-gelu")),
}
TEXT_ENCODERS = {"wan": ("UMT5Config", "UMT5EncoderModel"),
                 "cogvideox": ("T5Config", "T5EncoderModel")}
# What the published checkpoints store: the transformer in bfloat16 (CogVideoX-2b
# in float16), the VAE in float32.
STORED = {"wan": torch.bfloat16, "cogvideox": torch.float16}


def _module(library: str, class_name: str, config: dict, dtype: torch.dtype):
    import importlib

    cls = getattr(importlib.import_module(library), class_name)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in its stored dtype: no float32 copy first
    try:
        if library == "diffusers":
            return cls.from_config(config)
        return cls(config if isinstance(config, cls.config_class) else cls.config_class(**config))
    finally:
        torch.set_default_dtype(previous)


def build_pipeline(family_name: str, seed: int = 0, published_text_encoder: bool = False,
                   fewer: dict | None = None, device: str = "cpu"):
    """The real-size pipeline of ``family_name`` with random weights, in torch.

    ``published_text_encoder``: the text encoder's published configuration (UMT5-XXL,
    5.7B parameters) instead of the one-layer stand-in; ``fewer``: a component's
    configuration values to replace (``{"transformer": {"num_layers": 1}}``: a rehearsal
    of the real thing on a small machine); ``device``: where the weights are drawn
    (``cuda`` draws billions in seconds); the modules come back on the host."""
    import transformers

    from porter import registry as registry_mod, recipe

    family = registry_mod.loaded().family(family_name)
    source, text_config = LAYOUTS[family_name]
    configs = family.official_configs(source)
    fewer = fewer or {}

    def published(name: str):
        library, class_name, config = configs[name]
        return library, class_name, {**config, **fewer.get(name, {})}

    tiny = family.build_tiny(recipe.load(RECIPES / f"{family_name}-tiny.yaml"))
    config_cls, model_cls = (getattr(transformers, n) for n in TEXT_ENCODERS[family_name])
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        transformer = _module(*published("transformer"), STORED[family_name])
        vae = _module(*published("vae"), torch.float32)
        if published_text_encoder:
            text_encoder = _module(*published("text_encoder"), STORED[family_name])
        else:
            text_encoder = model_cls(config_cls(**text_config)).to(STORED[family_name])
    transformer, vae, text_encoder = (m.to("cpu") for m in (transformer, vae, text_encoder))
    return family.pipeline_class()(tokenizer=tiny.tokenizer, text_encoder=text_encoder,
                                   transformer=transformer, vae=vae, scheduler=tiny.scheduler)


def write_checkpoint(family_name: str, directory: Path, max_shard_size: str = "700MB",
                     **how) -> Path:
    """Save the real-size pipeline to ``directory`` as diffusers does (``how``: as
    ``build_pipeline`` takes it); returns it."""
    pipe = build_pipeline(family_name, **how)
    pipe.save_pretrained(directory, max_shard_size=max_shard_size)
    return directory


def weight_bytes(directory: Path) -> int:
    """Bytes of tensor data in every safetensors file under ``directory``."""
    total = 0
    for path in directory.rglob("*.safetensors"):
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        total += sum(v["data_offsets"][1] - v["data_offsets"][0] for v in header.values())
    return total


#: a layout Porter ships -> what a CPU can hold of it: each component's published
#: configuration with fewer layers (every tensor keeps its real width) and a short
#: vocabulary for the text encoder (the stand-in tokenizer's ids are below 384)
REAL_WIDTH = {
    "Wan-AI/Wan2.2-Animate-2-14B-Diffusers": {
        "transformer": {"num_layers": 2},
        "text_encoder": {"num_layers": 1, "num_decoder_layers": 1, "vocab_size": 384},
        "image_encoder": {"num_hidden_layers": 1},
    },
}


def write_real_width(source: str, directory: Path, max_shard_size: str = "700MB") -> Path:
    """The shipped layout of hub id ``source`` as a checkpoint of random weights at
    its real width (``REAL_WIDTH``: fewer layers), each model saved as diffusers or
    transformers saves it in the dtype the release stores (bfloat16; VAEs float32),
    the rest (index, tokenizer, scheduler) copied; returns ``directory``."""
    import importlib
    import shutil

    from porter.loading import published

    layout = published.layout(source)
    fewer = REAL_WIDTH[source]
    shutil.copytree(layout, directory)
    index = json.loads((layout / "modular_model_index.json").read_text())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for name, entry in index.items():
            config_file = layout / name / "config.json"
            if name.startswith("_") or not config_file.is_file():
                continue
            library, class_name = entry[0], entry[1]
            config = {**json.loads(config_file.read_text()), **fewer.get(name, {})}
            dtype = torch.float32 if name == "vae" else torch.bfloat16
            if library == "transformers":
                cls = getattr(importlib.import_module(library), class_name)
                config = cls.config_class.from_dict(config)
            module = _module(library, class_name, config, dtype)
            if library == "transformers":
                module = module.to(dtype)
            module.save_pretrained(directory / name, max_shard_size=max_shard_size)
    return directory
