"""Identical blocks traced and compiled once: a block list run as one ``lax.scan`` over
its blocks' weights, stacked.

A 40-block transformer traced block by block is 40 copies of the same computation for
XLA to optimise; as a scan it is one loop body, whatever the depth. The weights of
the blocks of a list are stacked along a new leading axis (each keeps its sharding
on the others), the list is replaced while the program is traced by ``ScanList``,
which the model's own loop (``for block in self.blocks: x = block(x, ...)``) iterates
as it would the blocks: its first block runs the scan over every block, the rest
hand on what it returned.

That is exact when the blocks run one after another, each block's outputs the next
one's first inputs and its other inputs the same for all: what the diffusers
transformers Porter's plugins know do (``ModelFamily.scan_blocks``). A loop that
changes the hidden states between blocks is refused while tracing (``Unscannable``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
from dataclasses import dataclass

import torch

from porter.errors import UsageError
from porter.shims import fixes as torchax_fixes
from porter.shims.compat import import_torchax
from porter.shims.interop import array_dtype
from porter.shims.tracing import model_frame, untraceable
from porter.shims.walk import tensor_slots
from porter.transforms import attention
from porter.transforms.jit import autosplit, lifting

STACKED = "*"  # the block index's place in a stacked entry's name: blocks.*.attn1...


class Unscannable(Exception):
    """The model does something between blocks that a scan would not."""


@dataclass(frozen=True)
class Group:
    """One stacked tensor: the same tensor of every block of ``blocks``."""

    blocks: str  # the block list's name (its path in the module)
    suffix: str  # the tensor's name inside a block
    keys: tuple[str, ...]  # the per-block names, in block order

    @property
    def key(self) -> str:
        return f"{self.blocks}.{STACKED}.{self.suffix}"


def identical_lists(module: torch.nn.Module) -> list[str]:
    """The names of ``module``'s block lists (the lists diffusers' hooks know) of at
    least two blocks of one class with the same tensors (names, shapes, dtypes)."""
    from diffusers.hooks._common import _ALL_TRANSFORMER_BLOCK_IDENTIFIERS

    found = []
    for name, blocks in module.named_children():
        if name not in _ALL_TRANSFORMER_BLOCK_IDENTIFIERS or \
                not isinstance(blocks, torch.nn.ModuleList) or len(blocks) < 2:
            continue
        shapes = [_signature(block) for block in blocks]
        if all(s == shapes[0] for s in shapes):
            found.append(name)
    return found


def _signature(block: torch.nn.Module) -> tuple:
    tensors = [*block.named_parameters(), *block.named_buffers()]
    return (type(block), tuple((n, tuple(t.shape), t.dtype) for n, t in tensors))


def groups(state: dict, lists: list[str]) -> list[Group]:
    """The stacked entries of ``state`` (name -> tensor or array, torchax's params or
    buffers of a module) for the block lists ``lists``."""
    found: dict[tuple[str, str], dict[int, str]] = {}
    for key in state:
        for blocks in lists:
            match = re.fullmatch(re.escape(blocks) + r"\.(\d+)\.(.+)", key)
            if match:
                found.setdefault((blocks, match.group(2)), {})[int(match.group(1))] = key
    return [Group(blocks, suffix, tuple(by_index[i] for i in sorted(by_index)))
            for (blocks, suffix), by_index in found.items()]


def stacked(state: dict, found: list[Group], stack) -> dict:
    """``state`` with each group's per-block entries replaced by ``stack(values)``."""
    out = {k: v for k, v in state.items()
           if not any(k in group.keys for group in found)}
    for group in found:
        out[group.key] = stack([state[k] for k in group.keys])
    return out


def _stacked_sharding(sharding):
    """A block's tensor's sharding, for their stack: the block index unsplit."""
    from jax.sharding import NamedSharding, PartitionSpec

    if isinstance(sharding, NamedSharding):
        return NamedSharding(sharding.mesh, PartitionSpec(None, *sharding.spec))
    return sharding


def stored_dtype(dtype):
    """The dtype a stack of ``dtype`` tensors is held in. Half-precision and 8-bit
    floats (quantized weights) are held as unsigned integers of their width, bit for
    bit, and each block's slice is read back as floats inside the scan: XLA's CPU
    backend upcasts every half-precision operation to float32, the scan's slicing of the
    stack included, and then converts the whole stack once, ahead of the loop (a float32
    copy of the weights: 2x their bytes; measured on Wan 1.3B, 10.3 GiB peak instead of
    4.9). As integers the slicing is data movement. On TPU both compile to the same
    memory and bytes accessed (a 30-block bfloat16 stack on v6e-8, measured)."""
    import jax.numpy as jnp

    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize in (1, 2):  # fp8 too
        return jnp.dtype({1: jnp.uint8, 2: jnp.uint16}[dtype.itemsize])
    return dtype


def stack_placed(arrays: list):
    """Placed per-block arrays as one array, stacked on a new leading axis, each block
    sharded as its tensor was (one compiled copy; the per-block arrays can go)."""
    return _stacker(_stacked_sharding(arrays[0].sharding))(*arrays)


@functools.cache
def _stacker(sharding):
    """One jitted stack per sharding: tensors of one shape reuse its program."""
    import jax
    import jax.numpy as jnp

    def stack(*xs):  # as integers from the start: a float16 stack is float32 on a CPU
        dtype = stored_dtype(xs[0].dtype)
        return jnp.stack([jax.lax.bitcast_convert_type(x, dtype) for x in xs])
    return jax.jit(stack, out_shardings=sharding)


def stack_abstract(values: list):
    """Abstract per-block arrays (ShapeDtypeStructs) as their stack's."""
    import jax

    first = values[0]
    return jax.ShapeDtypeStruct((len(values), *first.shape), stored_dtype(first.dtype),
                                sharding=_stacked_sharding(first.sharding))


def scanned_call(functional_call, model: torch.nn.Module, lists: list[str]):
    """``functional_call(method, params, buffers, *args, **kwargs)`` (torchax's
    JittableModule's) taking stacked entries in ``params`` and ``buffers``: while it
    runs, each list of ``lists`` is a ``ScanList`` over them."""
    def call(method, params, buffers, *args, **kwargs):
        state = {**params, **buffers}
        stacks = {name: {k.split(".", 2)[2]: v for k, v in state.items()
                         if k.startswith(f"{name}.{STACKED}.")} for name in lists}
        rest = {k: v for k, v in params.items() if f".{STACKED}." not in k}
        rest_buffers = {k: v for k, v in buffers.items() if f".{STACKED}." not in k}
        with contextlib.ExitStack() as stack:
            for name in lists:
                stack.enter_context(_swapped(model, name, ScanList(model._modules[name],
                                                                   stacks[name])))
            return functional_call(method, rest, rest_buffers, *args, **kwargs)
    return call


@contextlib.contextmanager
def _swapped(model, name: str, replacement):
    original = model._modules[name]
    model._modules[name] = replacement
    try:
        yield
    finally:
        model._modules[name] = original


class ScanList(torch.nn.Module):
    """Stands in for a block list while a program is traced: iterated as the list is,
    its first block runs every block as one scan; the others pass its result on."""

    def __init__(self, blocks: torch.nn.ModuleList, weights: dict):
        super().__init__()
        object.__setattr__(self, "_template", blocks[0])  # not a child: no tensors here
        object.__setattr__(self, "_weights", weights)  # suffix -> stacked torchax tensor
        self._dtypes = {name: array_dtype(t.dtype) for name, t in  # each block's own
                        [*blocks[0].named_parameters(), *blocks[0].named_buffers()]}
        self._count = len(blocks)
        self._last = None  # what the scan returned, handed on by the later blocks

    def __len__(self) -> int:
        return self._count

    def __iter__(self):
        return iter([self[i] for i in range(self._count)])

    def __getitem__(self, index: int):
        if isinstance(index, slice):
            raise Unscannable("the model slices its block list")
        index = range(self._count)[index]
        return _Step(self, index)

    def run_all(self, args: tuple, kwargs: dict):
        """Every block, as one scan, from the first block's call."""
        bound = self._bound(args, kwargs)
        carried = self._carried(bound)
        outputs = self._scan(bound, carried)
        self._last = (carried, outputs)
        return outputs

    def hand_on(self, args: tuple, kwargs: dict):
        """A later block: its carried inputs must be what the block before returned."""
        if self._last is None:
            raise Unscannable("a block ran before the first one")
        carried, outputs = self._last
        bound = self._bound(args, kwargs)
        given = [bound.arguments.get(name) for name in carried]
        previous = outputs if isinstance(outputs, tuple) else (outputs,)
        if any(a is not b for a, b in zip(given, previous)):
            raise Unscannable("the model changes the hidden states between blocks")
        return outputs

    def _bound(self, args: tuple, kwargs: dict) -> inspect.BoundArguments:
        return inspect.signature(type(self._template).forward).bind(
            self._template, *args, **kwargs)

    def _call(self, bound, weights: dict, carry: tuple, carried: list[str]):
        """The template block with ``weights``, ``carry`` in place of the carried
        inputs; its outputs as a tuple."""
        call = inspect.BoundArguments(bound.signature, dict(bound.arguments))
        call.arguments.update(zip(carried, carry))
        out = torch.func.functional_call(self._template, weights, call.args[1:], call.kwargs)
        return tuple(out) if isinstance(out, tuple) else (out,)

    def _carried(self, bound) -> list[str]:
        """The inputs each block hands to the next: as many leading arguments as the
        block returns tensors (found by tracing one block for its shapes only)."""
        import jax

        interop = import_torchax().interop
        names = [p.name for p in bound.signature.parameters.values()][1:]  # self
        first = {k: v[0] for k, v in interop.jax_view(self._weights).items()}
        with attention.repeated(0):  # shapes only: this block's attention never runs
            shapes = jax.eval_shape(lambda: interop.jax_view(
                self._call(bound, interop.torch_view(self._as_computed(first)), (), [])))
        carried = names[:len(shapes)]
        if not all(isinstance(bound.arguments.get(n), torch.Tensor) for n in carried):
            raise Unscannable(f"a block returns {len(shapes)} tensor(s), but its first "
                              f"{len(shapes)} argument(s) are not all tensors")
        return carried

    def _scan(self, bound, carried: list[str]):

        interop = import_torchax().interop
        start = tuple(bound.arguments[n] for n in carried)

        def body(carry, weights):
            computed = interop.torch_view(self._as_computed(interop.jax_view(weights)))
            return self._call(bound, computed, carry, carried), None

        carry, _ = torch_scan(body, start, self._weights, self._count)
        return carry if len(carried) > 1 else carry[0]

    def _as_computed(self, weights: dict) -> dict:
        """One block's slices of the stacks (jax arrays) in the block's own dtypes
        (``stored_dtype``)."""
        import jax

        return {k: v if v.dtype == self._dtypes[k]
                else jax.lax.bitcast_convert_type(v, self._dtypes[k])
                for k, v in weights.items()}


def torch_scan(body, carry, xs, trips: int):
    """``jax.lax.scan`` over torchax values: ``body(carry, x) -> (carry, y)`` takes and
    returns torch tensors (pytrees of them), is traced once and runs ``trips`` times
    (attention inside it counted that many times); (the final carry, the ys stacked)."""
    import jax

    interop = import_torchax().interop

    def traced(c, x):
        new, y = body(interop.torch_view(c), interop.torch_view(x))
        return interop.jax_view(new), interop.jax_view(y)

    with attention.repeated(trips):
        final, ys = jax.lax.scan(traced, interop.jax_view(carry), interop.jax_view(xs))
    return interop.torch_view(final), interop.torch_view(ys)


class _Step:
    """One block of a ``ScanList``, as the model's loop calls it."""

    def __init__(self, owner: ScanList, index: int):
        self.owner, self.index = owner, index

    def __call__(self, *args, **kwargs):
        if self.index == 0:
            return self.owner.run_all(args, kwargs)
        return self.owner.hand_on(args, kwargs)

    def __getattr__(self, name):  # a block's attributes (its config, its modules)
        return getattr(self.owner._template, name)


def stack_in_place(jittable, lists: list[str]) -> None:
    """Stack, on the devices, each tensor of the blocks of ``lists`` in torchax's
    JittableModule ``jittable`` (its params and buffers), one tensor at a time; the
    module's own per-block tensors become meta tensors (shapes, no memory), so each
    block's memory is freed once its stack is made: the weights are never held twice."""
    from torchax.tensor import Tensor

    env = import_torchax().default_env()
    slots = tensor_slots(jittable._model)
    for store in (jittable.params, jittable.buffers):
        for group in groups(store, lists):
            arrays = [store.pop(key).jax() for key in group.keys]
            # one group at a time: its blocks freed before the next stack is made
            store[group.key] = Tensor(stack_placed(arrays).block_until_ready(), env)
            del arrays
            for key in group.keys:
                for owner, name in slots.get(key, ()):
                    owner[name] = _meta_like(owner[name])


def _meta_like(tensor: torch.Tensor) -> torch.Tensor:
    placeholder = torch.empty(tuple(tensor.shape), dtype=tensor.dtype, device="meta")
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(placeholder, requires_grad=tensor.requires_grad)
    return placeholder


def refusing(traced, component: str, signature_of):
    """A compiled method over scanned blocks: ``traced(static_names, *args, **kwargs)``
    (as ``autosplit.splitting_call`` calls it), where what cannot be traced, or scanned,
    is the recipe's to settle (the weights are stacked: no block runs on its own)."""

    def call(*args, **kwargs):
        # a tensor the pipeline made on the host (no device given) crosses in here
        args, kwargs = torchax_fixes.on_device((args, kwargs))
        named_args, named_kwargs = autosplit.as_keywords(signature_of, args, kwargs)
        try:
            return traced(autosplit.static_names(named_kwargs), *named_args,
                          **named_kwargs)
        except (Unscannable, *untraceable(), lifting.StateChanged) as exc:
            where = model_frame(exc)
            raise UsageError(f"{component} cannot be compiled with its blocks as one scan:"
                             f" {exc}" + (f" (at {where})" if where else ""),
                             hint=f"set compile.{component}.scan: false (the blocks are "
                                  "then traced one by one)") from None
    return call
