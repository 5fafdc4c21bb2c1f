"""Text encodings kept: a port answers a text encoder's call from memory when it has
seen the same inputs before (the same token ids, mask and settings), so a server or a
batch that sees a prompt again, and every empty negative prompt after the first,
skips the encoder.

What is kept is the encoder's output as it was returned (on the mesh, where the
encoder runs there), keyed by the component, the call's static arguments and the
bytes of its tensor inputs; the weights are the port's own for its life, so the key
needs no more. Bounded by ``runtime.text_cache_mb`` (least recently used out first;
0: off); an output larger than the bound (LTX-2's Gemma returns its logits and 49
hidden states: about 880 MiB) is not kept, said once. The kept outputs live where the
encoder put them (on the mesh): `porter plan` and `porter compile` do not count them,
so a recipe that fits tightly lowers the bound. A hit returns fresh tensor objects
over the same arrays: a pipeline's in-place change of what it got never reaches the
kept copy.

Every component whose name starts with ``text_encoder`` is wrapped where the pipeline
calls it (its ``forward``); a pipeline that calls a submodule of its encoder directly
(MiniMax-H3's ``.model``) encodes every time. Inputs that are not token-sized (over
``MAX_INPUT`` numbers: an image) are never keyed. Each call's hits and misses go into
its run record (``text_encoding``).
"""

from __future__ import annotations

import functools
import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from porter.runtime import notices
from porter.shims import lazy
from porter.shims.compat import import_torchax
from porter.shims.interop import to_host
from porter.transforms import Pass

torch = lazy.module("torch", __name__)
pytree = lazy.module("torch.utils._pytree", __name__)

if TYPE_CHECKING:
    from porter.transforms import Checking
    from porter.transforms.building import Building

#: the most numbers an input of a cached call may hold (token ids and masks of a few
#: prompts; a picture is never keyed)
MAX_INPUT = 1 << 16


@dataclass
class Kept:
    """The kept encodings of one port, most recently used last."""

    limit: int  # bytes
    entries: OrderedDict = field(default_factory=OrderedDict)  # key -> (output, bytes)
    held: int = 0
    hits: int = 0
    misses: int = 0
    too_large: set = field(default_factory=set)  # the encoders whose output is never kept

    def counts(self) -> dict:
        return {"from_memory": self.hits, "encoded": self.misses}

    def get(self, key):
        if key not in self.entries:
            return None
        self.entries.move_to_end(key)
        return self.entries[key][0]

    def put(self, key, output, name: str = "") -> None:
        size = _bytes(output)
        if size > self.limit:
            if name not in self.too_large:  # said once: every call of it is encoded
                self.too_large.add(name)
                notices.warn(f"{name}'s output ({size / 2**20:.0f} MiB) is larger than "
                             f"runtime.text_cache_mb ({self.limit // 2**20}): not kept, "
                             "every prompt is encoded")
            return
        self.entries[key] = (output, size)
        self.held += size
        while self.held > self.limit:
            _, (_, dropped) = self.entries.popitem(last=False)
            self.held -= dropped


def cached(call, name: str, kept: Kept):
    """``call`` (a text encoder's forward) answered from ``kept`` for inputs seen
    before."""

    @functools.wraps(call)
    def encode(*args, **kwargs):
        key = _key(name, args, kwargs)
        if key is not None and (found := kept.get(key)) is not None:
            kept.hits += 1
            return _fresh(found)
        kept.misses += 1
        output = call(*args, **kwargs)
        if key is not None:
            kept.put(key, output, name)
            return _fresh(output)
        return output

    return encode


def _key(name: str, args: tuple, kwargs: dict):
    """What decides the call's output besides the weights; None where an input cannot
    be read (too large, or a traced value)."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    parts = [name, str(spec)]
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            values = _host(leaf)
            if values is None:
                return None
            parts.append((tuple(leaf.shape), str(leaf.dtype),
                          hashlib.sha256(values.tobytes()).hexdigest()))
        else:
            parts.append(repr(leaf))
    return tuple(parts)


def _host(tensor: torch.Tensor):
    """The tensor's bytes on the host, for the key; None where there are too many or
    no values to read (a traced value, inside a compiled call)."""
    if tensor.numel() > MAX_INPUT:
        return None
    try:
        host = to_host(tensor)  # every process together, as they call the encoder
    except Exception:  # noqa: BLE001 - a traced or meta tensor: no values
        return None
    return host.contiguous().view(torch.uint8).numpy()  # any dtype, bfloat16 too


def _fresh(output):
    """``output`` with new tensor objects over the same values (JAX arrays do not
    change; host tensors are copied)."""

    def fresh(tensor):
        if hasattr(tensor, "jax"):  # a torchax tensor (or a view of one): its array
            torchax = import_torchax()
            return torchax.tensor.Tensor(tensor.jax(), torchax.default_env())
        return tensor.clone()

    return pytree.tree_map_only(torch.Tensor, fresh, output)


def _bytes(output) -> int:
    return sum(leaf.numel() * leaf.element_size()
               for leaf in pytree.tree_leaves(output) if isinstance(leaf, torch.Tensor))


def encoders(modules: dict) -> list[str]:
    """The components the pass keeps encodings of."""
    return sorted(name for name in modules if name.startswith("text_encoder"))


# ------------------------------------------------------------------------- the pass

def _apply(b: Building) -> None:
    limit = b.recipe.runtime.text_cache_mb * 2**20
    if limit <= 0:
        return
    b.encodings = Kept(limit)
    for name in encoders(b.modules):
        component = getattr(b.pipe, name, None)
        # the module itself where the attention pass wrapped it (``Skipped`` calls it)
        component = getattr(component, "_target", component)
        if isinstance(component, torch.nn.Module):
            component.forward = cached(component.forward, name, b.encodings)


def _detail(c: Checking) -> str | None:
    mb = c.recipe.runtime.text_cache_mb
    names = encoders(c.modules)
    if mb <= 0 or not names:
        return None
    return f"{', '.join(names)}: outputs kept for inputs seen again (up to {mb} MiB)"


PASS = Pass(
    "encodings", ("runtime",), "keep the text encoders' outputs: a prompt seen again, "
    "and every empty negative prompt after the first, skips the encoder",
    apply=_apply, detail=_detail)
