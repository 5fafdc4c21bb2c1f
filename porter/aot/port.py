"""A recipe's components ported as ``porter run`` ports them, with no weights: every
tensor a compiled program takes is abstract (a ``jax.ShapeDtypeStruct`` in the
``NamedSharding`` the run would place it in) on a deviceless mesh of the target.

The run's own passes, in its order (``porter.port.passes``, each pass's ``abstract``
part): patches, set-up calls, dtypes, sharding rules and activation constraints,
rotary tables, the compile rules (one device for unsharded components, scans) and
the attention backend. LoRA adapters are fused into the weights a run loads: they
change no shape, so nothing here depends on them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from porter.aot import targets
from porter.port import active, passes
from porter.runtime import Runtime, resolve_mesh, xla
from porter.shims import interop, walk
from porter.shims.compat import import_torchax
from porter.transforms import Calling, attention
from porter.transforms import sharding as shard_transform
from porter.transforms.building import Building, Ported
from porter.transforms.jit import scan

if TYPE_CHECKING:
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe
    from porter.registry import Registry


@dataclass
class Component:
    """One component as a run ports it: its meta module (patched forward hooks, rotary
    buffers installed), its compiled methods, and where each of its tensors lives."""

    name: str
    module: torch.nn.Module
    rule: object  # CompileRule, or None: the run does not compile it
    assignments: list  # sharding.Assignment of every parameter and buffer
    one_device: bool  # unsharded and compiled whole: runs on one device per process
    attention_skipped: bool  # runs with torchax's attention (attention.skip, one device)
    axes: dict = field(default_factory=dict)  # the mesh's
    activations: list = field(default_factory=list)  # its activation rules (sharding's)
    scanned: list = field(default_factory=list)  # block lists compiled as one scan each
    jittable: object = None  # torchax JittableModule: its params and buffers, by name
    state: tuple = ()  # (params, buffers): name -> jax.ShapeDtypeStruct
    #: bytes a chip holds of the weights as the compiler is given them (each abstract
    #: weight's shard in its sharding): ``weights_bytes_per_chip``, by another road
    sharded_bytes_per_chip: int = 0

    @property
    def weights_bytes_per_chip(self) -> int:
        """What each chip holds of this component: ``porter plan``'s figure."""
        return sum(a.bytes_per_device(self.axes) for a in self.assignments)


@dataclass
class AbstractPort:
    recipe: Recipe
    registry: Registry
    family: ModelFamily
    target: targets.Target
    runtime: Runtime  # the target's deviceless mesh, its platform, its XLA options
    components: dict  # name -> Component
    ported: Ported  # what the passes recorded (the patches a run applies around calls)

    @contextlib.contextmanager
    def active(self, component: str):
        """What a run has in place while it calls ``component``'s programs: every pass's
        call-time part (``porter.port.active``: the patches, the attention backend for
        the target's platform and mesh; around a transformer, the video's grid), and
        torchax's environment."""
        calling = Calling(self.recipe, self.registry, self.family, self.runtime,
                          self.ported)
        entered = active.transformer_calls(calling) \
            if component in self.family.stepped_transformers else active.entered(calling)
        with entered, self.runtime.env:
            yield

    @property
    def resident_bytes_per_chip(self) -> dict[str, int]:
        """Each component's weights on every chip while a run goes on: each is placed
        when the port is built and stays until it ends."""
        return {name: c.weights_bytes_per_chip for name, c in self.components.items()}


def target_runtime(recipe: Recipe, target: targets.Target) -> Runtime:
    """The target's mesh (the recipe's axes on its chips), platform and XLA options."""

    axes = resolve_mesh(recipe.mesh, target.chips, given=True, target=target.name)
    mesh = targets.mesh(target, axes)
    device = mesh.devices.flat[0]
    options = xla.options(recipe.runtime.xla_options, target.platform, device)
    return Runtime(env=import_torchax().default_env(), mesh=mesh, platform=target.platform,
                   device_kind=device.device_kind, cache=None, xla_options=options)


def build(recipe: Recipe, registry: Registry, target: targets.Target) -> AbstractPort:
    """The recipe's port for ``target``, every tensor abstract: the passes' ``abstract``
    parts (``porter.port.passes``), in the run's order."""
    family = registry.family(recipe.model.family)
    b = Building(recipe, registry, family, target_runtime(recipe, target))
    with b.stack:  # the patches, while the passes run
        passes.build(b, abstract=True)
    skipped = attention.skipped(b)
    components = {}
    for name, module in b.modules.items():
        components[name] = Component(
            name, module, b.compile.rules.get(name), b.placement.assignments[name],
            one_device=name in b.compile.one_device, attention_skipped=name in skipped,
            axes=b.runtime.axes, activations=b.placement.activations.get(name, []),
            scanned=b.compile.scanned.get(name, []))
    for component in components.values():
        component.jittable, component.state, component.sharded_bytes_per_chip = \
            _abstract_state(component, b.runtime)
    return AbstractPort(recipe, registry, family, target, b.runtime, components,
                        b.ported())


def _abstract_state(component: Component, runtime: Runtime):
    """torchax's view of the module (what a compiled call passes as params and buffers)
    with each tensor abstract, in the sharding a run places it in (found by the tensor
    itself: torchax may name a tied weight otherwise than the rules do); and the bytes
    a chip holds of the planned weights in those shardings."""
    import jax
    from jax.sharding import NamedSharding, SingleDeviceSharding

    torchax = import_torchax()
    jittable = torchax.compile(component.module,
                               torchax.CompileOptions(methods_to_compile=[]))
    slots = walk.tensor_slots(component.module)
    specs = {id(store[key]): a.spec for a in component.assignments
             for store, key in slots[a.name][:1]}
    first = runtime.mesh.devices.flat[0]

    def sharding(tensor):
        if component.one_device:
            return SingleDeviceSharding(first)
        return NamedSharding(runtime.mesh,
                             shard_transform.partition_spec(specs.get(id(tensor), ())))

    def abstract_of(store: dict) -> dict:
        return {name: jax.ShapeDtypeStruct(tuple(t.shape), interop.array_dtype(t.dtype),
                                           sharding=sharding(t))
                for name, t in store.items()}

    def stacked(found: dict) -> dict:  # as a run stacks them (porter.transforms.jit.scan)
        return scan.stacked(found, scan.groups(found, component.scanned),
                            scan.stack_abstract)

    tensors = {**jittable.params, **jittable.buffers}
    planned = {id(t): name for name, t in tensors.items() if id(t) in specs}
    abstract = abstract_of(tensors)
    held = sum(_shard_bytes(abstract[name]) for name in planned.values())
    return (jittable, (stacked(abstract_of(jittable.params)),
                       stacked(abstract_of(jittable.buffers))), held)


def _shard_bytes(value) -> int:
    """Bytes one device holds of an abstract array in its sharding (the first device's
    share: shards of one array are the same size)."""
    import math

    return math.prod(value.sharding.shard_shape(value.shape)) * value.dtype.itemsize


__all__ = ["AbstractPort", "Component", "build", "target_runtime"]
