"""LoRA adapters written by diffusers and PEFT themselves, for tiny models."""

import torch

TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"]
#: image-to-video layouts with CLIP image tokens: their cross-attention's image projections
IMAGE_TARGETS = ["add_k_proj", "add_v_proj"]
#: diffusers' module names -> the original Wan code's, which the community formats keep
ORIGINAL = {"attn1.to_q": "self_attn.q", "attn1.to_k": "self_attn.k",
            "attn1.to_v": "self_attn.v", "attn1.to_out.0": "self_attn.o",
            "attn2.to_q": "cross_attn.q", "attn2.to_k": "cross_attn.k",
            "attn2.to_v": "cross_attn.v", "attn2.to_out.0": "cross_attn.o",
            "attn2.add_k_proj": "cross_attn.k_img", "attn2.add_v_proj": "cross_attn.v_img",
            "ffn.net.0.proj": "ffn.0", "ffn.net.2": "ffn.2"}
#: the key formats published Wan LoRAs come in (besides diffusers' own): lightx2v's
#: (original names, lora_down/up, alpha, bias updates as diff_b and zero norm updates
#: as diff), ComfyUI's (original names, lora_A/B) and musubi-tuner's as Kijai
#: publishes some (lora_unet_ names with underscores, alpha)
FORMATS = ("lightx2v", "comfyui", "musubi")


def make_lora(directory, variant="t2v", rank=4, alpha=8, seed=1, bias=False,
              name="pytorch_lora_weights.safetensors", targets=TARGETS):
    """A random LoRA in diffusers' format (PEFT keys, adapter metadata with alpha != rank),
    written by diffusers' own save_lora_weights."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    from porter_wan.tiny import build

    pipe = build(variant)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets,
                        init_lora_weights=False, lora_bias=bias)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pipe.transformer.add_adapter(config)
        if bias:
            for module in pipe.transformer.modules():
                if hasattr(module, "lora_B") and module.lora_B["default"].bias is not None:
                    torch.nn.init.normal_(module.lora_B["default"].bias)
    layers = get_peft_model_state_dict(pipe.transformer)
    type(pipe).save_lora_weights(directory, transformer_lora_layers=layers, weight_name=name,
                                 transformer_lora_adapter_metadata=config.to_dict())
    return directory / name


def in_format(directory, style: str, variant="t2v", seed=1, name=None, rank=4):
    """A random LoRA for the tiny ``variant`` written with the key names of ``style``
    (``FORMATS``), every layer of every block adapted (and the image projections
    where the layout has them)."""
    import torch
    from safetensors.torch import load_file, save_file

    from porter_wan.tiny import VARIANTS

    image = VARIANTS[variant].get("clip", False)
    source = make_lora(directory, variant, rank=rank, seed=seed,
                       name=f"source-{seed}.safetensors",
                       targets=TARGETS + (IMAGE_TARGETS if image else []))
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for key, tensor in load_file(source).items():
        module, part = key.removeprefix("transformer.").split(".lora_")
        _, block, layer = module.split(".", 2)
        original = f"blocks.{block}.{ORIGINAL[layer]}"
        down = part.startswith("A")
        if style == "musubi":
            stem = "lora_unet_" + original.replace(".", "_")
            out[f"{stem}.lora_{'down' if down else 'up'}.weight"] = tensor
            out[f"{stem}.alpha"] = torch.tensor(float(rank // 2))
        elif style == "comfyui":
            out[f"diffusion_model.{original}.lora_{'A' if down else 'B'}.weight"] = tensor
        else:
            stem = f"diffusion_model.{original}"
            out[f"{stem}.lora_{'down' if down else 'up'}.weight"] = tensor
            out[f"{stem}.alpha"] = torch.tensor(float(rank * 2))
            if not down:  # the bias update, and a norm's (zero, as lightx2v's are)
                out[f"{stem}.diff_b"] = torch.randn(tensor.shape[0], generator=generator)
                out[f"diffusion_model.blocks.{block}.norm3.diff"] = torch.zeros(24)  # the tiny width
    path = directory / (name or f"{style}-{seed}.safetensors")
    save_file(out, path)
    source.unlink()
    return path
