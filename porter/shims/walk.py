"""Walking a torch module's tree: its tensors, each once, and its block lists. What the
passes and a component's sketch (``porter.transforms.sketch``) read of a module."""

from __future__ import annotations

from porter.shims import lazy

torch = lazy.module("torch", __name__)


def tensor_slots(module: torch.nn.Module) -> dict[str, list[tuple[dict, str]]]:
    """Every parameter and buffer (non-persistent ones too), by the name of its first
    occurrence: the (store, key) slots that hold it. A tied weight has several."""
    first: dict[int, str] = {}
    slots: dict[str, list[tuple[dict, str]]] = {}
    for prefix, sub in module.named_modules():
        for store in (sub._parameters, sub._buffers):
            for key, tensor in store.items():
                if tensor is not None:
                    name = first.setdefault(id(tensor), f"{prefix}.{key}" if prefix else key)
                    slots.setdefault(name, []).append((store, key))
    return slots


def named_tensors(module: torch.nn.Module):
    """(name, tensor) for every parameter and buffer, each tensor once."""
    for name, held in tensor_slots(module).items():
        store, key = held[0]
        yield name, store[key]


def block_lists(module) -> list:
    """The module's block lists as (name, ModuleList), in the order diffusers' hooks
    find them (its children's order, the names diffusers knows)."""
    from diffusers.hooks._common import _ALL_TRANSFORMER_BLOCK_IDENTIFIERS

    return [(name, child) for name, child in module.named_children()
            if name in _ALL_TRANSFORMER_BLOCK_IDENTIFIERS
            and isinstance(child, torch.nn.ModuleList)]
