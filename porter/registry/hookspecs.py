"""Every hook a Porter plugin can implement, in one place.

A plugin is a module (or object) with functions marked ``@porter.hookimpl``
whose names are hooks below, exposed through the ``porter`` entry-point group::

    [project.entry-points.porter]
    mymodel = "porter_mymodel"

A function marked ``@hookimpl`` whose name is not a hook here is an error when
plugins load (a typo never fails silently).

Registration hooks take a ``register`` callback rather than returning values:
the core owns the names, rejects duplicates, and remembers which plugin
registered what (``porter plugins`` shows it).
"""

from __future__ import annotations

from typing import Callable

import pluggy

hookspec = pluggy.HookspecMarker("porter")
hookimpl = pluggy.HookimplMarker("porter")


@hookspec
def porter_register_families(register: Callable) -> None:
    """Register model families.

    Arguments:
        register: call ``register(family)`` once per family, where ``family``
            is a ``porter.families.base.ModelFamily`` instance with a unique ``name``
            (recipes select it with ``model.family: <name>``).

    Returns nothing. Every plugin's implementation is called (no first-answer
    wins); registering a name already taken raises ``PluginError``.
    """


@hookspec
def porter_register_patches(register: Callable) -> None:
    """Register patches.

    Arguments:
        register: call ``register(patch)`` once per ``porter.shims.patch.Patch``;
            names are global, so prefix them with the plugin (``wan.rope_cache``).

    Returns nothing. Every plugin's implementation is called; a name already
    taken raises ``PluginError``. A patch's target is resolved when a recipe
    is validated, not at registration, so registering is cheap.
    """


@hookspec
def porter_register_attention(register: Callable) -> None:
    """Register attention backends.

    Arguments:
        register: call ``register(backend)`` once per
            ``porter.transforms.attention.AttentionBackend``: a name (recipes use
            it in ``attention.backend``), a kernel
            ``kernel(q, k, v, keep, *, scale, block_q, block_kv)`` on JAX arrays laid
            out (batch, heads, sequence, head_dim) where ``keep`` is None or a
            boolean mask (False: the key gets zero weight), a doc line, and the
            platforms it runs on. A kernel that also takes ``platform`` gets the
            platform its program is compiled for ("tpu" for ``porter compile
            --target v6e-8`` on a CPU host), to choose its code path by.

    Returns nothing. Every plugin's implementation is called; a name already
    taken (or ``auto``, reserved) raises ``PluginError``. The core shards the
    kernel over the mesh (batch, heads, or sequence) around it.
    """
