"""Traced programs kept on disk, so a second identical run skips tracing too.

JAX's persistent compile cache skips XLA compilation in a second run, but
tracing the PyTorch model through torchax and lowering it still take seconds
(most of a warm run's compile time for the tiny Wan). A compiled component's
method is exported once (``jax.export``: the StableHLO with its shardings),
serialized next to the compile cache, and later runs call the stored program.

The key covers everything a trace depends on: the recipe (patches, dtypes,
sharding, attention; not the prompts, seed or output settings), the versions of Porter's
dependencies, the source of Porter and of the plugins in play, the component and
method, the static arguments, the state that changes what is traced
(``porter.runtime.trace_context.key``), and every input's shape, dtype and sharding.
Weights are inputs, never constants, so new weights of the same shapes reuse the
program. Programs that cannot be exported (host callbacks, e.g. ``torch-cpu``
attention) and methods with donated inputs use plain ``jax.jit``.

Entries are checked before use: each file starts with its key and the SHA-256
of the program, so a damaged entry or one stored under another key (files
swapped) is never run; such an entry, or one whose first call fails, is
deleted, traced again and reported once. The cache only saves time: a write
that fails (no space, read-only, a file in the way) warns once and the run
continues without storing programs.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from porter.runtime import atomic, distributed, notices, trace_context
from porter.runtime.versions import versions

if TYPE_CHECKING:
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe
    from porter.registry import Registry
    from porter.runtime import Runtime

_NOT_EXPORTABLE = object()


class _Damaged(Exception):
    pass

_MAGIC = b"porter-trace 1\n"


def _pack(key: str, blob: bytes) -> bytes:
    return _MAGIC + f"{key}\n{hashlib.sha256(blob).hexdigest()}\n".encode() + bytes(blob)


def _unpack(key: str, data: bytes) -> bytes | None:
    """The program stored under ``key``, or None if ``data`` is not that, intact."""
    if not data.startswith(_MAGIC):
        return None
    parts = data[len(_MAGIC):].split(b"\n", 2)
    if len(parts) != 3 or parts[0] != key.encode():
        return None
    if hashlib.sha256(parts[2]).hexdigest().encode() != parts[1]:
        return None
    return parts[2]


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
        self.loaded = self.exported = self.discarded = 0  # for the run record
        self.writable = True
        self._programs: dict = {}  # key -> callable program (or _NOT_EXPORTABLE)
        self._unproven: set = set()  # keys loaded from disk and not yet run once

    def forget(self) -> None:
        """Drop the programs held in memory: the next calls load them from disk, as
        a second run would (``porter bench`` measures that)."""
        self._programs.clear()

    def key(self, name: str, static: dict, args, kwargs) -> str:
        import jax

        leaves, tree = jax.tree.flatten((args, kwargs))
        text = "\n".join([self.fingerprint, name, repr(sorted(static.items())), str(tree),
                          repr(trace_context.key()), *map(_describe, leaves)])
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
            if key not in self._unproven:
                return program(*args, **kwargs)
            try:  # the first call of a stored program proves it
                result = program(*args, **kwargs)
            # a program that does not fit its inputs (another program under this key);
            # a runtime failure (out of memory) is not the entry's fault: it propagates
            except (TypeError, ValueError) as exc:
                self._discard(key, f"its first call failed ({type(exc).__name__})")
                program = self._programs[key] = self._program(key, jitted, args, kwargs,
                                                              static, compiler_options)
                return (jitted(*args, **kwargs, **static) if program is _NOT_EXPORTABLE
                        else program(*args, **kwargs))
            self._unproven.discard(key)
            return result
        return call

    def split_store(self, component: str) -> Path:
        """Where the automatic split of ``component`` is remembered (its key: this
        cache's fingerprint and the component's name)."""
        key = hashlib.sha256(f"{self.fingerprint}\nsplit\n{component}".encode()).hexdigest()
        return self.directory / f"{key}.split.json"

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.exported"

    def _discard(self, key: str, why: str) -> None:

        self._unproven.discard(key)
        self.discarded += 1
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError:
            pass
        notices.warn(f"discarded a stored traced program in {self.directory} ({why}); "
                     "traced again")

    def _program(self, key: str, jitted, args, kwargs, static, compiler_options):
        import jax
        from jax import export

        path = self._path(key)
        if path.exists():
            try:
                blob = _unpack(key, path.read_bytes())
                if blob is None:
                    raise _Damaged("damaged, or stored under another key")
                exported = export.deserialize(bytearray(blob))
            except _Damaged as exc:
                self._discard(key, str(exc))
            except Exception as exc:  # noqa: BLE001 - unreadable, from another JAX
                self._discard(key, f"unreadable: {type(exc).__name__}")
            else:
                self.loaded += 1
                self._unproven.add(key)
                return jax.jit(exported.call, compiler_options=compiler_options)
        try:
            exported = export.export(jitted)(*args, **kwargs, **static)
            blob = exported.serialize()
        except Exception:  # e.g. host callbacks cannot be serialized
            return _NOT_EXPORTABLE
        self._write(path, blob)
        self.exported += 1
        return jax.jit(exported.call, compiler_options=compiler_options)

    def _write(self, path: Path, blob: bytes) -> None:

        if not distributed.writes() or not self.writable:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            atomic.write_bytes(path, _pack(path.stem, blob))  # whole, or nothing
        except OSError as exc:
            self.writable = False
            notices.warn(f"traced programs cannot be stored in {self.directory} "
                         f"({exc.strerror or exc}); continuing without storing them",
                         hint="free space there or fix its permissions; PORTER_CACHE_DIR "
                              "moves the cache")


#: recipe keys that never reach a traced program: what a video is made from (its
#: values enter as inputs, their shapes are in every trace key anyway) and where
#: the results go. Changing them keeps the stored traces.
NOT_TRACED = ("output", "verify", "generate.prompt", "generate.negative_prompt",
              "generate.seed", "generate.image", "generate.last_image", "generate.video",
              "generate.mask", "generate.control_video",
              # fused into the weights before tracing: the programs take weights as inputs
              "lora",
              # decided between programs: a cached transformer's pieces are programs of
              # their own names (transformer.blocks.0.forward, ...), whatever the method
              "cache")


def traced_settings(recipe: Recipe) -> str:
    """The recipe's settings that a traced program may depend on, as canonical JSON."""
    data = recipe.resolved()
    for dotted in NOT_TRACED:
        *parents, last = dotted.split(".")
        owner = data
        for parent in parents:
            owner = owner.get(parent) or {}
        owner.pop(last, None)
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def for_port(recipe: Recipe, registry: Registry, family: ModelFamily,
             runtime: Runtime) -> TraceCache | None:
    """The traces a port of ``recipe`` stores and reuses, beside the compile cache (none
    when the cache is off). Their key names the code a trace runs: Porter, the family,
    and whatever plugins patch or attend with."""
    if runtime.cache is None:
        return None
    plugged = [type(family).__module__,
               *(p.replacement.__module__ for p in registry.patches.values()),
               *(b.kernel.__module__ for b in registry.attention.values())]
    parts = [traced_settings(recipe), repr(versions()), repr(runtime.axes),
             code_fingerprint(["porter", *plugged])]
    return TraceCache(runtime.cache / "porter-traces",
                      hashlib.sha256("\n".join(parts).encode()).hexdigest())
