"""The hardware ``porter compile --target`` compiles for: TPU slices by the names their
users rent them under, each chip's public facts, and its deviceless devices.

Names follow Cloud TPU's accelerator types: the number after the version counts
TensorCores for v4, v5p and v7x (two per chip: one JAX device per chip in megacore
mode for v4 and v5p, a v5p-8 is 4 devices; one device per TensorCore for v7x, a
v7x-8 is 4 chips and 8 devices) and chips for v5e and v6e (one TensorCore each: a
v6e-8 is 8 chips). ``chips`` below counts JAX devices, and a chip's facts
(``porter.runtime.chips``) are per device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from porter.errors import UsageError
from porter.runtime import mesh_text
from porter.runtime.chips import CHIPS, Chip
from porter.runtime.environment import libtpu_installed, quiet_libtpu, roomy_libtpu_stacks


@dataclass(frozen=True)
class Target:
    """A slice: ``chips`` devices of ``chip`` in libtpu's ``topology``."""

    name: str
    chip: str  # key of CHIPS
    topology: str  # libtpu's name, e.g. "v6e:2x4"
    chips: int
    hosts: int
    options: tuple = ()  # get_topology_desc keyword arguments, as (key, value) pairs

    @property
    def facts(self) -> Chip:
        return CHIPS[self.chip]

    @property
    def platform(self) -> str:
        return "tpu"


# chips_per_host_bounds (2, 4, 1): v5e and v6e serve from 8-chip hosts (ct5lp-hightpu-8t,
# ct6e-standard-8t); megacore: one device per v4/v5p chip, as JAX uses them
_EIGHT = (("chips_per_host_bounds", (2, 4, 1)),)
_ONE = (("chips_per_host_bounds", (1, 1, 1)),)
_MEGACORE = (("chip_config_name", "megacore"),)

TARGETS = {t.name: t for t in (
    Target("v4-8", "v4", "v4:2x2x1", 4, 1, _MEGACORE),
    Target("v4-16", "v4", "v4:2x2x2", 8, 2, _MEGACORE),
    Target("v5e-1", "v5e", "v5e:1x1", 1, 1, _ONE),
    Target("v5e-4", "v5e", "v5e:2x2", 4, 1),
    Target("v5e-8", "v5e", "v5e:2x4", 8, 1, _EIGHT),
    Target("v5e-16", "v5e", "v5e:4x4", 16, 2, _EIGHT),
    Target("v5p-8", "v5p", "v5:2x2x1", 4, 1, _MEGACORE),
    Target("v5p-16", "v5p", "v5:2x2x2", 8, 2, _MEGACORE),
    Target("v5p-32", "v5p", "v5:2x4x2", 16, 4, _MEGACORE),
    Target("v5p-64", "v5p", "v5:4x4x2", 32, 8, _MEGACORE),
    Target("v6e-1", "v6e", "v6e:1x1", 1, 1, _ONE),
    Target("v6e-4", "v6e", "v6e:2x2", 4, 1),
    Target("v6e-8", "v6e", "v6e:2x4", 8, 1, _EIGHT),
    Target("v6e-16", "v6e", "v6e:4x4", 16, 2, _EIGHT),
    # libtpu's default host for TPU7x: 2x2x1 chips (8 devices)
    Target("v7x-8", "v7x", "tpu7x:2x2x1", 8, 1),
    Target("v7x-16", "v7x", "tpu7x:2x2x2", 16, 2),
)}

#: other names the same slices go by
ALIASES = {"v5litepod-1": "v5e-1", "v5litepod-4": "v5e-4", "v5litepod-8": "v5e-8",
           "v5litepod-16": "v5e-16", "tpu7x-8": "v7x-8", "tpu7x-16": "v7x-16"}


def named(name: str) -> Target:
    """The target called ``name`` (UsageError naming the known ones otherwise)."""
    import difflib

    key = ALIASES.get(name.lower(), name.lower())
    if key in TARGETS:
        return TARGETS[key]
    hint = f"targets: {', '.join(TARGETS)}"
    close = difflib.get_close_matches(key, list(TARGETS) + list(ALIASES), n=1)
    if close:  # another name of a slice said with the one the list gives it
        also = f" ({ALIASES[close[0]]})" if close[0] in ALIASES else ""
        hint = f"did you mean {close[0]!r}{also}? " + hint
    raise UsageError(f"unknown target {name!r}", hint=hint)


def libtpu_missing() -> str | None:
    """Why this machine cannot compile for a TPU (None: it can)."""
    return None if libtpu_installed() else "libtpu is not installed"


def libtpu_requirement() -> str:
    """libtpu as Porter's ``tpu`` extra pins it (its installed metadata, pyproject.toml):
    what to install, since Porter itself comes from a checkout, not the package index."""
    from importlib import metadata

    try:
        wanted = metadata.requires("porter") or []
    except metadata.PackageNotFoundError:
        wanted = []
    from packaging.requirements import Requirement

    for text in wanted:
        requirement = Requirement(text)
        if requirement.name == "libtpu" and requirement.marker is not None \
                and requirement.marker.evaluate({"extra": "tpu"}):
            return f"libtpu{requirement.specifier}"
    return "libtpu"


def devices(target: Target) -> list:
    """The target's devices, compile-only (no TPU needed): ``libtpu`` describes them."""
    why = libtpu_missing()
    if why:
        raise UsageError(f"cannot compile for {target.name}: {why}",
                         hint=f"pip install '{libtpu_requirement()}' (Porter's tpu "
                              "extra: the version this JAX pins; about 700 MB)")
    quiet_libtpu()
    roomy_libtpu_stacks()
    from jax.experimental import topologies

    found = topologies.get_topology_desc(topology_name=target.topology, platform="tpu",
                                         **dict(target.options)).devices
    if len(found) != target.chips:  # the table and libtpu disagree: a Porter bug
        raise RuntimeError(f"{target.topology} gave {len(found)} devices, not "
                           f"{target.chips}")
    return list(found)


def mesh(target: Target, axes: dict[str, int]):
    """A mesh of the target's devices with ``axes`` (sizes multiply to at most its chips),
    laid out by JAX's mesh utilities so that inner axes are neighbours on the torus."""
    import numpy as np
    from jax.experimental import mesh_utils
    from jax.sharding import Mesh

    found = devices(target)
    count = math.prod(axes.values())
    if count != len(found):
        return Mesh(np.array(found[:count]).reshape(tuple(axes.values())), tuple(axes))
    try:
        chosen = mesh_utils.create_device_mesh(tuple(axes.values()), found)
    except NotImplementedError:  # an axis would split one of the torus's axes
        shown = mesh_text(axes)
        physical = target.topology.split(":")[1]
        raise UsageError(f"mesh {shown} does not fit {target.name}'s torus ({physical}): "
                         "each mesh axis must span whole axes of it",
                         hint=f"size the mesh's axes as products of {physical}'s "
                              "(axes of size 1 are free)") from None
    return Mesh(chosen, tuple(axes))
