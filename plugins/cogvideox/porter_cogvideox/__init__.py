"""Porter plugin for CogVideoX (1.0: 2b, 5b; 1.5: 5B)."""

from porter import hookimpl
from porter_cogvideox.family import CogVideoXFamily
from porter_cogvideox.patches import ALL


@hookimpl
def porter_register_families(register):
    register(CogVideoXFamily())


@hookimpl
def porter_register_patches(register):
    for patch in ALL:
        register(patch)
