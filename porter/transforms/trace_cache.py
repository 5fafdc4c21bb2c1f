"""Traced programs kept on disk, so a second identical run skips tracing too.

JAX's persistent compile cache skips XLA compilation in a second run, but
tracing the PyTorch model through torchax and lowering it still take seconds
(most of a warm run's compile time for the tiny Wan). A compiled component's
method is exported once (``jax.export``: the StableHLO with its shardings),
serialized next to the compile cache, and later runs call the stored program.

The key covers everything a trace depends on: the recipe (patches, dtypes,
sharding, attention; not the prompts, seed or output settings), the versions of Porter's dependencies, the source of
Porter and of the plugins in play, the component and method, the static
arguments, and every input's shape, dtype and sharding. Weights are inputs,
never constants, so new weights of the same shapes reuse the program.
Programs that cannot be exported (host callbacks, e.g. ``torch-cpu``
attention) and methods with donated inputs use plain ``jax.jit``.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

_NOT_EXPORTABLE = object()


def code_fingerprint(modules) -> str:
    """A hash of the Python source of the top-level packages of ``modules``."""
    digest = hashlib.sha256()
    for top in sorted({m.split(".")[0] for m in modules}):
        package = sys.modules.get(top)
        origin = getattr(package, "__file__", None)
        if origin is None:
            continue
        root = Path(origin).parent if Path(origin).name == "__init__.py" else Path(origin)
        files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
        for path in files:
            digest.update(str(path.relative_to(root.parent)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _describe(leaf) -> str:
    import jax

    sharding = getattr(leaf, "sharding", None)
    spec = getattr(sharding, "spec", None)
    mesh = getattr(sharding, "mesh", None)
    placed = f"{dict(mesh.shape)}{spec}" if spec is not None else type(sharding).__name__
    return f"{jax.typeof(leaf)}@{placed}"


class TraceCache:
    """Where exported programs live and what every key starts from."""

    def __init__(self, directory: Path, fingerprint: str):
        self.directory = directory
        self.fingerprint = fingerprint
        self.loaded = self.exported = 0  # for the run record
        self._programs: dict = {}  # key -> callable program (or _NOT_EXPORTABLE)

    def forget(self) -> None:
        """Drop the programs held in memory: the next calls load them from disk, as
        a second run would (``porter bench`` measures that)."""
        self._programs.clear()

    def key(self, name: str, static: dict, args, kwargs) -> str:
        import jax

        leaves, tree = jax.tree.flatten((args, kwargs))
        text = "\n".join([self.fingerprint, name, repr(sorted(static.items())), str(tree),
                          *map(_describe, leaves)])
        return hashlib.sha256(text.encode()).hexdigest()

    def jit(self, name: str, fn, static_argnames=(), donate_argnames=(), compiler_options=None):
        """``jax.jit(fn)``, backed by exported programs on disk."""
        import jax

        jitted = jax.jit(fn, static_argnames=static_argnames, donate_argnames=donate_argnames,
                         compiler_options=compiler_options)
        if donate_argnames:  # a stored program cannot donate its inputs
            return jitted

        def call(*args, **kwargs):
            static = {k: kwargs.pop(k) for k in static_argnames if k in kwargs}
            key = self.key(name, static, args, kwargs)
            program = self._programs.get(key)
            if program is None:
                program = self._programs[key] = self._program(key, jitted, args, kwargs,
                                                              static, compiler_options)
            if program is _NOT_EXPORTABLE:
                return jitted(*args, **kwargs, **static)
            return program(*args, **kwargs)
        return call

    def _program(self, key: str, jitted, args, kwargs, static, compiler_options):
        import jax
        from jax import export

        path = self.directory / f"{key}.exported"
        if path.exists():
            try:
                exported = export.deserialize(bytearray(path.read_bytes()))
                self.loaded += 1
                return jax.jit(exported.call, compiler_options=compiler_options)
            except Exception:  # unreadable or from another JAX: trace again below
                path.unlink(missing_ok=True)
        try:
            exported = export.export(jitted)(*args, **kwargs, **static)
            blob = exported.serialize()
        except Exception:  # e.g. host callbacks cannot be serialized
            return _NOT_EXPORTABLE
        self._write(path, blob)
        self.exported += 1
        return jax.jit(exported.call, compiler_options=compiler_options)

    def _write(self, path: Path, blob: bytes) -> None:
        from porter import distributed

        if not distributed.writes():
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".partial{os.getpid()}")
        partial.write_bytes(blob)
        os.replace(partial, path)  # a reader never sees half a program
