"""What a chunk loop carries from one compiled call to the next (``Cache``: a causal
VAE's cached frames, as one argument and result), and a loop's outputs handed on one
behind its dispatch (``one_ahead``): what the families' streamed decodes use (Wan's
VAE in ``porter.families.wan_vae``, CogVideoX's in its plugin), below the families so
that the core's own can."""

from __future__ import annotations


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
