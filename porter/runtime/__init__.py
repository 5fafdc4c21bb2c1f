"""The JAX side of a run: platform, virtual devices, compile cache, mesh.

Order matters: ``configure`` sets what JAX reads once, when it creates its devices
(``environment``), so it must run before anything asks JAX for devices; ``start``
imports jax and torchax (through ``porter.shims.compat``), turns on the compile cache
(``compile_cache``) and builds the mesh. The rest of the package is what a run needs
of its process: ``distributed`` (several processes), ``memory``, ``interrupt``
(signals), ``notices`` (what the user is told), ``atomic`` (files written whole),
``finite`` (NaN checks), ``monitor`` (compile work), ``xla`` (compiler options) and
``versions``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from porter.errors import UsageError
from porter.runtime import compile_cache, distributed, environment, memory, monitor, xla
from porter.shims.compat import import_torchax

if TYPE_CHECKING:
    from porter.recipe import Recipe


def configure(platform: str, cpu_devices: int | None) -> None:
    """Set what JAX reads when it starts: platform, virtual CPU device count, libtpu's
    settings."""
    if platform != "auto":
        environment.request_platform(platform)
    if cpu_devices:
        environment.request_cpu_devices(cpu_devices)
    if environment.tpu_attached():
        environment.roomy_libtpu_stacks()  # (elsewhere libtpu only starts to compile)
    else:
        environment.quiet_libtpu()
    environment.return_freed_memory()


def mesh_text(axes: dict) -> str:
    """A mesh as messages write it: "dp=2 x tp=4"."""
    return " x ".join(f"{axis}={size}" for axis, size in axes.items())


def resolve_mesh(axes: dict, device_count: int, given: bool = False,
                 target: str | None = None) -> dict[str, int]:
    """Fill an 'auto' axis and check the mesh fits ``device_count`` devices (that
    exist, that ``given`` by --devices, or the chips of the TPU slice ``target``)."""
    fixed = math.prod(size for size in axes.values() if size != "auto")
    if fixed > device_count:
        shape = mesh_text(axes)
        if target:
            have, more = f"{target} has {device_count} chips", (
                " or choose a larger target (v4 and v5p count two TensorCores a chip: a "
                "v5p-8 is 4 chips)")
        elif given:
            have, more = f"--devices gives {device_count}", f" or give --devices {fixed}"
        else:
            have, more = f"{device_count} exist", (
                f"; to check or plan for a machine with {fixed} devices from here, add "
                f"--devices {fixed}; to run on {fixed} virtual CPU devices, --cpu-devices "
                f"{fixed}")
        smaller = " ".join(f"mesh.{a}={n}" for a, n in _shrunk(axes, device_count).items())
        raise UsageError(f"mesh {shape} needs {fixed} devices but {have}",
                         hint=f"shrink the mesh (e.g. {smaller})" + more)
    resolved = {}
    for axis, size in axes.items():
        resolved[axis] = device_count // fixed if size == "auto" else size
    return resolved


def _shrunk(axes: dict, device_count: int) -> dict[str, int]:
    """The axes to change so the mesh fits ``device_count`` devices: the largest axis
    cut to its next smaller divisor, again until it fits (a mesh the devices hold;
    whether the model's shapes divide it, ``validate`` checks)."""
    sizes = {a: s for a, s in axes.items() if s != "auto"}
    while math.prod(sizes.values()) > device_count:
        axis = max(sizes, key=sizes.get)
        sizes[axis] = max(d for d in range(1, sizes[axis]) if sizes[axis] % d == 0)
    return {a: n for a, n in sizes.items() if n != axes[a]}


@dataclass
class Runtime:
    env: object  # torchax.tensor.Environment
    mesh: object  # jax.sharding.Mesh
    platform: str
    device_kind: str
    cache: Path | None
    xla_options: dict = field(default_factory=dict)  # jax.jit compiler_options

    @property
    def axes(self) -> dict[str, int]:
        return dict(self.mesh.shape)

    def replicated(self):
        from jax.sharding import NamedSharding, PartitionSpec
        return NamedSharding(self.mesh, PartitionSpec())


def start(recipe: Recipe) -> Runtime:
    """Import JAX and torchax, enable the compile cache, build the mesh."""
    configure(recipe.runtime.platform, recipe.runtime.cpu_devices)
    distributed.initialize()  # before JAX creates devices: the mesh spans every process
    torchax = import_torchax()
    import jax
    import numpy as np

    platform = jax.default_backend()
    options = xla.options(recipe.runtime.xla_options, platform)
    directory = compile_cache.enable(compile_cache.directory(recipe.runtime.compile_cache))
    monitor.compile_monitor()
    # a process working alone (a batch split between replicas) meshes its own devices
    devices = jax.local_devices() if distributed.alone() else jax.devices()
    axes = resolve_mesh(recipe.mesh, len(devices))
    used = np.array(devices[: math.prod(axes.values())]).reshape(tuple(axes.values()))
    mesh = jax.sharding.Mesh(used, tuple(axes))
    memory.mapped_at_start.cache_clear()  # JAX is up, this port's weights not loaded:
    memory.mapped_at_start()  # what the limits count from (a second port: from here)
    return Runtime(env=torchax.default_env(), mesh=mesh, platform=platform,
                   device_kind=devices[0].device_kind, cache=directory,
                   xla_options=options)
