"""A component's weights read from its safetensors files, one tensor at a time.

For a checkpoint on disk the module is built from its configuration with its
parameters on the meta device (no memory). ``ComponentWeights`` knows where
each of its tensors lies in the files (from their headers, ``checkpoints``),
and ``read`` brings one tensor, or only the rows a process needs, into host
memory in the dtype the recipe gives it, to be placed on the mesh and
dropped. Reads are positioned file reads into fresh tensors, not memory maps:
every page of a mapped file that is touched counts towards the process's
memory for as long as the file stays mapped.

Only a checkpoint whose files hold exactly the module's tensors, under the
module's names and shapes, is read this way. Anything the library loader
would have to rename, convert or initialize goes through the library instead
(``loading``), on the host, and is then placed the same way.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from porter.errors import LoadError
from porter.loading import checkpoints
from porter.shims import lazy

torch = lazy.module("torch", __name__)


@dataclass
class ComponentWeights:
    """Where each tensor of one component lies: module tensor name -> header entry."""

    entries: dict[str, checkpoints.Entry]
    read_bytes: int = 0  # what this process has read so far (only its rows)
    #: LoRA updates added as tensors are read: name -> ("weight" | "bias", lora.Delta)
    deltas: dict = field(default_factory=dict)
    #: a scaled fp8 file's scales: name -> the Entry of its scale (one, or one a row),
    #: multiplied in as the tensor is read (``single_file``)
    scales: dict = field(default_factory=dict)
    #: what a single file was read as (its format, whose key names), for the run record
    read_as: dict = field(default_factory=dict)
    #: name -> the LoadError of an fp8 tensor read with no scale whose values no weight
    #: cast to fp8 has (``cast_fp8_problem``): placement refuses them on every process
    #: together (each reads only its rows, so one may find what the others do not)
    unscaled: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def nbytes(self) -> int:
        unique = {(e.file, e.offset): e.nbytes for e in self.entries.values()}
        return sum(unique.values())

    def read(self, name: str, dtype: torch.dtype, rows: slice = slice(None)) -> torch.Tensor:
        """Rows ``rows`` of tensor ``name`` (all of them by default), in ``dtype``."""
        entry = self.entries[name]
        stored = checkpoints.torch_dtype(entry.dtype)
        tensor = self.stored(name, rows)
        start, stop, _ = rows.indices(entry.shape[0]) if entry.shape else (0, 1, 1)
        if name in self.scales:
            tensor = self._scaled(tensor, self.scales[name], slice(start, stop))
        elif problem := cast_fp8_problem(tensor):
            with self._lock:
                self.unscaled[name] = LoadError(f"{entry.file}: {name}: {problem}",
                                                hint=SCALES_LOST)
        if name in self.deltas:  # a LoRA update, in float32 before the cast
            what, delta = self.deltas[name]
            return delta.added(what, tensor, dtype, slice(start, stop))
        return tensor if stored == dtype else tensor.to(dtype)

    def stored(self, name: str, rows: slice = slice(None)) -> torch.Tensor:
        """Rows ``rows`` of tensor ``name``, as the file stores them (no scale, no cast)."""
        entry = self.entries[name]
        shape = entry.shape
        start, stop, _ = rows.indices(shape[0]) if shape else (0, 1, 1)
        row_bytes = entry.nbytes // shape[0] if shape and shape[0] else entry.nbytes
        data = torch.empty((stop - start) * row_bytes, dtype=torch.uint8)
        _read_into(entry.file, data, entry.offset + start * row_bytes)
        with self._lock:  # reads run in several threads
            self.read_bytes += data.numel()
        return data.view(checkpoints.torch_dtype(entry.dtype)).reshape(
            (stop - start, *shape[1:]) if shape else ())

    def _scaled(self, tensor: torch.Tensor, entry, rows: slice) -> torch.Tensor:
        """An fp8 tensor times its scale, in float32: one scale for the tensor, or one
        for each of its rows."""
        data = torch.empty(entry.nbytes, dtype=torch.uint8)
        _read_into(entry.file, data, entry.offset)
        scale = data.view(checkpoints.torch_dtype(entry.dtype)).float().flatten()
        if scale.numel() > 1:
            scale = scale[rows].reshape(-1, *([1] * (tensor.dim() - 1)))
        return tensor.float() * scale


#: what to do with an fp8 file whose values are scaled fp8's but whose scales are gone
SCALES_LOST = ("the file has lost its scale_weight tensors (and its scaled_fp8 marker): "
               "use the file as published, or one in bfloat16")


def cast_fp8_problem(tensor: torch.Tensor) -> str | None:
    """Why an fp8 tensor read with no scale cannot be a weight cast to fp8, or None.

    A cast keeps a weight's own values, far below 1 in a trained model; scaled fp8
    divides each weight by its largest value / the format's limit, so every scaled
    weight reaches that limit (448 in e4m3). Read without its scale, such a weight is
    hundreds of times too large and the latents come out finite but ~1e9 too large.
    Values past half the format's range are therefore refused. Bytes, not floats, are
    compared (fp8 is sign-magnitude: the low 7 bits order the values by size), at the
    speed of reading memory; a NaN byte hides the rest (NaN is counted at placement)."""
    dtype = tensor.dtype
    if not dtype.is_floating_point or dtype.itemsize != 1 or tensor.numel() == 0:
        return None
    top = (tensor.reshape(-1).view(torch.uint8) & 0x7F).max().reshape(1)
    largest, limit = float(top.view(dtype).float()), torch.finfo(dtype).max
    if not math.isfinite(largest) or largest <= limit / 2:
        return None
    return (f"{str(dtype).removeprefix('torch.')} values up to {largest:g} with no scale "
            f"(the format holds up to {limit:g}): a weight cast to fp8 keeps its own, far "
            "smaller values; these are scaled fp8 weights read without their scales")


def _read_into(path: Path, buffer: torch.Tensor, offset: int) -> None:
    view, done = memoryview(buffer.numpy()), 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while done < len(view):
            count = os.preadv(fd, [view[done:]], offset + done)
            if count == 0:
                raise LoadError(f"{path}: ends {len(view) - done} bytes early (changed since "
                                "it was checked?)", hint="re-download or re-save the file")
            done += count
    finally:
        os.close(fd)


def for_module(module: torch.nn.Module, folder: Path, library: str) -> ComponentWeights | None:
    """Where ``module``'s tensors lie in ``folder``'s weight files, or None when the
    files do not hold exactly its tensors (names, shapes, loadable dtypes): then only
    the library's own loader knows how to turn them into the module."""
    files, problems = checkpoints.weight_files(folder, library)
    if not files or problems:
        return None
    found, problems = checkpoints.found_tensors(files)
    if problems:
        return None
    expected = module.state_dict(keep_vars=True)
    found = checkpoints.align_prefix(module, expected, found)
    if any(name not in expected for name in found):
        return None  # the loader may rename these: not ours to guess
    aliases: dict[int, list[str]] = {}
    for name, tensor in expected.items():
        aliases.setdefault(id(tensor), []).append(name)
    entries = {}
    for names in aliases.values():
        tensor = expected[names[0]]
        entry = next((found[n] for n in names if n in found), None)
        if entry is None:
            if tensor.is_meta:
                return None  # the loader would initialize it (and warn)
            continue  # a buffer that keeps the value it was built with
        if tuple(entry.shape) != tuple(tensor.shape) or checkpoints.torch_dtype(
                entry.dtype) is None:
            return None
        entries.update({name: entry for name in names})
    return ComponentWeights(entries)
