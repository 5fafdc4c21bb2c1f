"""A loop over chunks that carries a cache, traced and compiled once its cache has
settled: the rest of the chunks as one ``lax.scan``.

Causal video VAEs decode (and encode) a video a few frames at a time: Wan's decoder
runs once per latent frame, each call reading and replacing a list of cached frames
(one entry per causal convolution). Traced as written, a 720p Wan decode is 21 copies
of the decoder for XLA to compile. The first calls differ (the cache starts empty,
some entries hold a marker, frames are added until each entry holds its full
window); once a call leaves the cache as it found it (the same entries, shapes and
dtypes), every later call on a chunk of the same shape is the same computation on
different values: a scan whose carry is the cache's tensors.
"""

from __future__ import annotations

from typing import Callable

import torch

from porter.errors import PorterError
from porter.transforms.jit.scan import torch_scan


def run(pieces: list, step: Callable, cache: list) -> list:
    """``[step(piece, first) for each piece]``, in order, where ``step`` reads and
    replaces entries of the list ``cache`` (tensors, or markers such as None) and
    depends on which piece it runs only through ``first`` (the first piece's call).
    Once a later call leaves ``cache`` with the signature it found, the following
    pieces of that call's shape run as one ``lax.scan`` (torchax tensors only: plain
    PyTorch runs the loop as written)."""
    outputs, index = [], 0
    while index < len(pieces):
        before = _signature(cache)
        outputs.append(step(pieces[index], index == 0))
        index += 1
        same = _same_shape_run(pieces, index, like=pieces[index - 1])
        if index > 1 and same > 1 and _signature(cache) == before and on_jax(pieces):
            outputs.extend(_scanned(pieces[index:index + same], step, cache))
            index += same
    return outputs


def on_jax(tensors: list) -> bool:
    """Are these torchax tensors (or views of them: what slicing returns), JAX values
    traced or not, rather than plain PyTorch's?"""
    return all(hasattr(t, "jax") for t in tensors)


def _signature(cache: list) -> tuple:
    """What a call's program depends on in ``cache``: each tensor's shape and dtype,
    each other entry's value."""
    return tuple((tuple(e.shape), e.dtype) if isinstance(e, torch.Tensor) else ("value", e)
                 for e in cache)


def _same_shape_run(pieces: list, start: int, like) -> int:
    """How many pieces from ``start`` on have the shape of ``like`` (the piece whose
    call left the cache settled: a piece of another shape may not)."""
    count = 0
    while start + count < len(pieces) and \
            tuple(pieces[start + count].shape) == tuple(like.shape):
        count += 1
    return count


def _scanned(pieces: list, step: Callable, cache: list) -> list:
    """``step`` on each of ``pieces`` (one shape) as one ``lax.scan``, the tensors of
    ``cache`` its carry; ``cache`` left as the last call leaves it."""
    slots = [i for i, entry in enumerate(cache) if isinstance(entry, torch.Tensor)]
    settled = _signature(cache)

    def body(carry, piece):
        for slot, value in zip(slots, carry):
            cache[slot] = value
        out = step(piece, False)
        if _signature(cache) != settled:  # a marker the carry would not hand on
            raise PorterError("a chunk's call changed the cache it had left settled: its "
                              "loop cannot run as one scan",
                              hint="leave the patch that scans this loop out of the "
                                   "recipe's patches")
        return tuple(cache[slot] for slot in slots), out

    final, outs = torch_scan(body, tuple(cache[slot] for slot in slots),
                             torch.stack(pieces), len(pieces))
    for slot, value in zip(slots, final):
        cache[slot] = value
    return list(torch.unbind(outs))
