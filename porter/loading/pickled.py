"""A PyTorch checkpoint (``torch.save``'s zip format: ``.pth``, ``.pt``) located tensor
by tensor without loading it, so that it is read like a safetensors file.

``torch.load`` under a ``FakeTensorMode`` reads only the pickle: every tensor comes
back without data, its storage carrying ``_checkpoint_offset``, where the storage's
bytes begin in the file (torch's zip format stores them uncompressed). The pickle is
read with ``weights_only=True``: PyTorch's restricted unpickler, which builds tensors
and containers and runs no other code from the file.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

from porter.loading.checkpoints import DTYPES, CorruptFile, Entry
from porter.shims import lazy

torch = lazy.module("torch", __name__)

SUFFIXES = (".pth", ".pt")
#: keys some training scripts wrap a state dict in
WRAPPERS = ("state_dict", "model", "module")


def read_entries(path: Path) -> dict[str, Entry]:
    """Tensor name -> Entry (dtype, shape, byte offset) for each tensor of the file's
    state dict; CorruptFile when it is not a zip-format checkpoint of tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not zipfile.is_zipfile(path):
        raise CorruptFile("not a zip-format PyTorch checkpoint (torch.save's format since "
                          "PyTorch 1.6; an older file: load and save it again)")
    with zipfile.ZipFile(path) as archive:  # offsets hold only for stored, not deflated,
        packed = [info.filename for info in archive.infolist()  # data (torch.save's way)
                  if "/data/" in info.filename and info.compress_type != zipfile.ZIP_STORED]
    if packed:
        raise CorruptFile(f"its tensor data is compressed ({packed[0]}; re-zipped by another "
                          "tool?): load and save it again with torch.save")
    try:
        with FakeTensorMode():
            loaded = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # the restricted unpickler names what it refused
        raise CorruptFile(f"torch.load (weights only) cannot read it: "
                          f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    state = _state_dict(loaded)
    # torch dtype -> its safetensors name, the names ``Entry`` carries
    names = {getattr(torch, attr): name for name, attr in DTYPES.items()
             if hasattr(torch, attr)}
    entries = {}
    for name, tensor in state.items():
        if not tensor.is_contiguous():
            raise CorruptFile(f"tensor {name!r} is stored strided (a view of a larger "
                              "tensor, not contiguous): load and save the file again")
        if tensor.dtype not in names:
            raise CorruptFile(f"tensor {name!r} has dtype {tensor.dtype}, which cannot be read")
        start = tensor.untyped_storage()._checkpoint_offset
        nbytes = tensor.numel() * tensor.element_size()
        entries[name] = Entry(names[tensor.dtype], tuple(tensor.shape), path,
                              start + tensor.storage_offset() * tensor.element_size(), nbytes)
    return entries


def _state_dict(loaded) -> dict:
    for key in WRAPPERS:  # {"state_dict": {...}, "epoch": ...} and the like, one level
        inner = loaded.get(key) if isinstance(loaded, dict) else None
        if isinstance(inner, dict) and inner and all(
                isinstance(value, torch.Tensor) for value in inner.values()):
            loaded = inner
            break
    if not isinstance(loaded, dict) or not loaded:
        raise CorruptFile(f"it holds a {type(loaded).__name__}, not a state dict "
                          "(names -> tensors)")
    others = [name for name, value in loaded.items() if not isinstance(value, torch.Tensor)]
    if others:
        raise CorruptFile(f"its state dict holds {len(others)} entries that are not "
                          f"tensors (e.g. {others[0]!r})")
    return loaded


def identity(path: Path) -> dict:
    """The file named cheaply: its size and the SHA-256 of its pickle (names, dtypes,
    shapes and places of every tensor; not the data), as ``header_identity`` names a
    safetensors file."""
    with zipfile.ZipFile(path) as archive:
        member = next(n for n in archive.namelist() if n.endswith("data.pkl"))
        digest = hashlib.sha256(archive.read(member)).hexdigest()
    return {"bytes": path.stat().st_size, "header_sha256": digest}
