"""LoRA adapters written by diffusers and PEFT themselves, for tiny models."""

import torch

TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"]


def make_lora(directory, variant="t2v", rank=4, alpha=8, seed=1, bias=False,
              name="pytorch_lora_weights.safetensors"):
    """A random LoRA in diffusers' format (PEFT keys, adapter metadata with alpha != rank),
    written by diffusers' own save_lora_weights."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    from porter_wan.tiny import build

    pipe = build(variant)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=TARGETS,
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
