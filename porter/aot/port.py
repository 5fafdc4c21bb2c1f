"""A recipe's components ported as ``porter run`` ports them, with no weights: every
tensor a compiled program takes is abstract (a ``jax.ShapeDtypeStruct`` in the
``NamedSharding`` the run would place it in) on a deviceless mesh of the target.

The run's own steps, in its order: the recipe's dtypes (on the meta models), set-up
calls, patches, activation constraints, rotary tables, sharding rules, the
one-device rule for unsharded components, input shardings and the attention
backend, all from the same functions ``porter run`` calls. LoRA adapters are fused
into the weights a run loads: they change no shape, so nothing here depends on them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from porter import abstract, patches, porting
from porter.errors import UsageError
from porter.runtime import Runtime, resolve_mesh
from porter.transforms import attention, placement
from porter.transforms import compile as compile_transform
from porter.transforms import rotary, scan
from porter.transforms import setup as setup_transform
from porter.transforms import sharding as shard_transform

from porter.aot import targets


@dataclass
class Component:
    """One component as a run ports it: its meta module (patched forward hooks, rotary
    buffers installed), its compiled methods, and where each of its tensors lives."""

    name: str
    module: torch.nn.Module
    rule: object  # CompileRule, or None: the run does not compile it
    assignments: list  # sharding.Assignment of every parameter and buffer
    one_device: bool  # unsharded and compiled whole: runs on one device per process
    attention_skipped: bool  # the recipe's attention.skip names it
    axes: dict = field(default_factory=dict)  # the mesh's
    scanned: list = field(default_factory=list)  # block lists compiled as one scan each
    jittable: object = None  # torchax JittableModule: its params and buffers, by name
    state: tuple = ()  # (params, buffers): name -> jax.ShapeDtypeStruct

    @property
    def weights_bytes_per_chip(self) -> int:
        """What each chip holds of this component: ``porter plan``'s figure."""
        return sum(a.bytes_per_device(self.axes) for a in self.assignments)


@dataclass
class AbstractPort:
    recipe: object
    registry: object
    family: object
    target: targets.Target
    runtime: Runtime  # the target's deviceless mesh, its platform, its XLA options
    components: dict  # name -> Component
    chosen: list  # the patches a run applies

    @contextlib.contextmanager
    def active(self):
        """What a run has in place while it calls its programs: the patches, the
        attention backend (for the target's platform and mesh) and torchax's
        environment."""
        with patches.applied(self.chosen), \
                porting.attention_installed(self.recipe, self.registry, self.runtime), \
                self.runtime.env:
            yield

    @property
    def resident_bytes_per_chip(self) -> int:
        """Weights every chip holds while a run goes on: each component is placed when
        the port is built and stays until it ends."""
        return sum(c.weights_bytes_per_chip for c in self.components.values())


def target_runtime(recipe, target: targets.Target) -> Runtime:
    """The target's mesh (the recipe's axes on its chips), platform and XLA options."""
    from porter import runtime as runtime_mod
    from porter.compat import import_torchax

    try:
        axes = resolve_mesh(recipe.mesh, target.chips, given=True)
    except UsageError as exc:
        raise UsageError(exc.message.replace(f"--devices gives {target.chips}",
                                             f"{target.name} has {target.chips} chips"),
                         hint="shrink the mesh (e.g. mesh.dp=1), or choose a larger "
                              "target") from None
    mesh = targets.mesh(target, axes)
    device = mesh.devices.flat[0]
    options = runtime_mod.xla_options(recipe.runtime.xla_options, target.platform, device)
    return Runtime(env=import_torchax().default_env(), mesh=mesh, platform=target.platform,
                   device_kind=device.device_kind, cache=None, xla_options=options)


def build(recipe, registry, target: targets.Target) -> AbstractPort:
    """The recipe's port for ``target``, every tensor abstract (see the module doc)."""
    family = registry.family(recipe.model.family)
    runtime = target_runtime(recipe, target)
    modules = abstract.components(family, recipe)  # meta models, the recipe's dtypes
    if modules is None:
        raise UsageError(f"cannot compile {recipe.model.source!r} without its "
                         "configuration", hint="point model.source at a local diffusers "
                         "directory (configuration files are enough)")
    pipe = SimpleNamespace(**modules)
    setup_transform.apply(pipe, recipe)
    chosen = porting.selected_patches(recipe, registry, family)
    rules = compile_transform.rules(recipe, family)
    in_pieces = porting.cached_components(recipe, family, modules)
    components = {}
    with patches.applied(chosen):
        for name, module in modules.items():
            activations = recipe.sharding.activations.get(name, [])
            shard_transform.constrain_activations(module, runtime, activations)
            assignments = shard_transform.assign(shard_transform.named_tensors(module),
                                                 recipe.sharding.weights.get(name, []))
            whole = name in rules and rules[name].modules is None and name not in in_pieces
            components[name] = Component(
                name, module, rules.get(name), assignments,
                one_device=whole and runtime.mesh.devices.size > 1
                and placement.unsharded(assignments, activations),
                attention_skipped=name in recipe.attention.skip, axes=runtime.axes,
                scanned=scan.identical_lists(module) if whole and rules[name].scan else [])
        if recipe.rotary.precompute:  # buffers of the rotary modules: shapes only here
            rotary.apply(pipe, family, recipe, lambda table: table.to("meta"))
    for component in components.values():
        component.jittable, component.state = _abstract_state(component, runtime)
    return AbstractPort(recipe, registry, family, target, runtime, components, chosen)


def _abstract_state(component: Component, runtime):
    """torchax's view of the module (what a compiled call passes as params and buffers)
    with each tensor abstract, in the sharding a run places it in."""
    import jax
    from jax.sharding import NamedSharding, SingleDeviceSharding

    from porter.compat import import_torchax

    torchax = import_torchax()
    jittable = torchax.compile(component.module,
                               torchax.CompileOptions(methods_to_compile=[]))
    specs = {a.name: a.spec for a in component.assignments}
    first = runtime.mesh.devices.flat[0]

    def sharded(name: str):
        if component.one_device:
            return SingleDeviceSharding(first)
        return NamedSharding(runtime.mesh, shard_transform.partition_spec(specs.get(name, ())))

    def abstract_of(store: dict) -> dict:
        found = {name: jax.ShapeDtypeStruct(tuple(t.shape), jax_dtype(t.dtype),
                                            sharding=sharded(name))
                 for name, t in store.items()}
        # stacked as a run stacks them (porter.transforms.scan)
        return scan.stacked(found, scan.groups(found, component.scanned),
                            scan.stack_abstract)
    return jittable, (abstract_of(jittable.params), abstract_of(jittable.buffers))


def jax_dtype(dtype: torch.dtype):
    """The JAX dtype a torch tensor of ``dtype`` has on a device (x64 disabled)."""
    from torchax.ops import mappings

    return mappings.t2j_dtype(shard_transform.jax_dtype(dtype))


__all__ = ["AbstractPort", "Component", "build", "target_runtime", "jax_dtype"]
