"""What the tests share: where things are, the tiny recipe most tests start from, and
(in the modules here) fresh processes, references computed by plain diffusers, and
the hostile-input harness."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
RECIPES = ROOT / "recipes"


def vae_split_rule(axes: str = "[dp, tp]") -> str:
    """The rule ``porter.transforms.sharding.vae_split`` gives an accelerator mesh, as a
    recipe override (CPU devices, which keep one device by default, take it this way)."""
    from porter.transforms.sharding import VAE_BLOCKS

    return f"sharding.activations.vae=[{{module: '{VAE_BLOCKS}', spec: ['...', {axes}]}}]"


#: a Wan-style transformer over ``tp=2`` with its heads there and its weights split as
#: recipes/wan-generic-base.yaml splits them (Megatron's), as recipe overrides
WAN_TP2 = ["mesh={tp: 2}", "attention.head_axis=tp", "sharding.weights.transformer=["
           r"{match: 'blocks\.\d+\.attn[12]\.to_[qkv]\.(weight|bias)', spec: [tp]}, "
           r"{match: 'blocks\.\d+\.attn[12]\.to_out\.0\.weight', spec: [null, tp]}, "
           r"{match: 'blocks\.\d+\.ffn\.net\.0\.proj\.(weight|bias)', spec: [tp]}, "
           r"{match: 'blocks\.\d+\.ffn\.net\.2\.weight', spec: [null, tp]}]"]

TINY_RECIPE = """\
model: {family: wan, source: tiny}
generate:
  prompt: "a cat"
  height: 32
  width: 32
  frames: 9
  steps: 3
  max_sequence_length: 16
"""


def in_training(pipe) -> list[str]:
    """The modules of ``pipe``'s components left in training mode (dropout on), by name:
    a built pipeline should have none, as ``from_pretrained``'s has none."""
    import torch

    return [f"{name}.{sub}" for name, component in pipe.components.items()
            if isinstance(component, torch.nn.Module)
            for sub, module in component.named_modules() if module.training]
