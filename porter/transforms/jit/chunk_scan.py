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


def one_ahead(outputs):
    """Each of ``outputs`` (an iterator whose items are computations dispatched to the
    device) handed on once the next has been dispatched: the device computes the next
    while the caller works on this one (brings it to the host, encodes it)."""
    outputs = iter(outputs)
    pending = next(outputs, None)
    for output in outputs:
        yield pending
        pending = output
    if pending is not None:
        yield pending


class Cache(list):
    """A chunk loop's cache (its entries, in order) as one argument and result of a
    compiled call: its tensors are the program's inputs and outputs, its markers (None,
    a string such as Wan's ``"Rep"``) part of the program's signature, so a call whose
    cache holds other markers is another program and a settled cache is the same one
    every chunk. A list (unhashable: never a static argument, even holding markers
    alone; what walks lists walks it), and a pytree node of its own."""

    def __init__(self, entries=()):
        super().__init__(entries)
        _register()  # before JAX or torchax first meets one

    @staticmethod
    def is_marker(entry) -> bool:
        return entry is None or isinstance(entry, str)


def _flatten_cache(cache: Cache):
    # by what is not a marker (a JAX array while tracing, a torch tensor outside)
    kinds = tuple(entry if Cache.is_marker(entry) else ... for entry in cache)
    return [e for e in cache if not Cache.is_marker(e)], kinds


def _unflatten_cache(values, kinds) -> Cache:
    values = iter(values)
    return Cache([next(values) if kind is ... else kind for kind in kinds])


def _register() -> None:
    """``Cache`` as a pytree node for PyTorch and JAX (torchax maps both ways), and for
    jax.export (the trace cache keeps programs that take and return one); once."""
    global _registered
    if _registered:
        return
    import json

    import jax
    from torch.utils import _pytree

    _pytree.register_pytree_node(Cache, _flatten_cache, _unflatten_cache,
                                 serialized_type_name="porter.Cache")
    jax.tree_util.register_pytree_node(Cache, _flatten_cache,
                                       lambda kinds, values: _unflatten_cache(values, kinds))
    jax.export.register_pytree_node_serialization(
        Cache, serialized_name="porter.Cache",
        serialize_auxdata=lambda kinds: json.dumps(
            [{"tensor": True} if k is ... else k for k in kinds]).encode(),
        deserialize_auxdata=lambda data: tuple(
            ... if isinstance(k, dict) else k for k in json.loads(data)))
    _registered = True


_registered = False
