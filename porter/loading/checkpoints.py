"""Weight files of a local diffusers directory, checked from their headers alone.

A safetensors file starts with an 8-byte little-endian header length and a JSON
header giving each tensor's dtype, shape and byte range; nothing else is read
here. Against the configuration-built meta model (porter.loading.abstract), that is
enough to find, before any weight is loaded or anything compiles: missing
weight files and shards, truncated or corrupt files, tensors of the wrong
shape or of a dtype torch cannot load into the parameter, and tensors the
model needs that no file holds. The aim is no false alarms on a checkpoint
that diffusers loads correctly, so wherever the loader could rename, tie or
convert weights, the check says nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from porter.errors import LoadError
from porter.loading import abstract
from porter.shims import lazy

torch = lazy.module("torch", __name__)

SHOWN = 12  # problems listed in the error; the rest are counted
MAX_HEADER = 100_000_000  # safetensors' own limit on the JSON header, in bytes

# The file each library reads, in the order it looks for them (diffusers takes an
# index first, transformers the single file): a stale second file is never read,
# so it is never checked.
WEIGHT_FILES = {
    "diffusers": ("diffusion_pytorch_model.safetensors.index.json",
                  "diffusion_pytorch_model.safetensors"),
    "transformers": ("model.safetensors", "model.safetensors.index.json"),
}
# Any of these means the folder has weights in some form (.bin is a pickle: it is
# never opened here; the loader reads it with torch.load(weights_only=True)).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf")

# safetensors dtype names -> torch dtype attribute (absent in older torch: unloadable)
DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
          "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64",
          "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
          "F8_E4M3": "float8_e4m3fn", "F8_E4M3FNUZ": "float8_e4m3fnuz",
          "F8_E5M2": "float8_e5m2", "F8_E5M2FNUZ": "float8_e5m2fnuz",
          "F8_E8M0": "float8_e8m0fnu", "C64": "complex64", "C128": "complex128"}


class CorruptFile(Exception):
    """A safetensors file whose header or size is wrong (message says how)."""


@dataclass(frozen=True)
class Entry:
    dtype: str  # safetensors name, e.g. "BF16"
    shape: tuple[int, ...]
    file: Path
    offset: int = 0  # where the tensor's bytes start in the file
    nbytes: int = 0


def torch_dtype(name: str) -> torch.dtype | None:
    attr = DTYPES.get(name)
    return getattr(torch, attr, None) if attr else None


# --- one file ---------------------------------------------------------------------

def read_header(path: Path) -> dict[str, Entry]:
    """Tensor name -> Entry, from the header; CorruptFile if the header is unreadable
    or the file is not exactly as long as the header says. safetensors' own
    loader refuses such files too, but without saying how many bytes are gone."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CorruptFile(f"truncated: {size} bytes, too short for a safetensors header")
        length = int.from_bytes(head, "little")
        if length > MAX_HEADER:  # garbage, not a header: do not read gigabytes of it
            raise CorruptFile(f"not a safetensors file: its first 8 bytes give a header "
                              f"of {length} bytes")
        if length > size - 8:
            raise CorruptFile(f"truncated inside its header: {8 + length} bytes of header "
                              f"expected, {size} present")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise CorruptFile("its header is not valid JSON (not a safetensors file?)") from None
    if not isinstance(header, dict):
        raise CorruptFile("its header is not a JSON object (not a safetensors file?)")
    header.pop("__metadata__", None)
    entries = {name: _entry(name, value, path, 8 + length) for name, value in header.items()}
    expected = 8 + length + max((_end(v) for v in header.values()), default=0)
    if size < expected:
        raise CorruptFile(f"truncated: {expected} bytes expected, {size} present "
                          f"({expected - size} missing)")
    if size > expected:
        raise CorruptFile(f"{size} bytes where its header accounts for {expected} "
                          "(extra data at the end)")
    return entries


def _entry(name: str, value, path: Path, data_start: int) -> Entry:
    try:
        shape = tuple(int(d) for d in value["shape"])
        begin, end = (int(x) for x in value["data_offsets"])
        dtype = str(value["dtype"])
    except (KeyError, TypeError, ValueError):
        raise CorruptFile(f"header entry {name!r} lacks dtype, shape or data_offsets") from None
    dt = torch_dtype(dtype)
    if dt is not None and end - begin != _numel(shape) * dt.itemsize:
        raise CorruptFile(f"header entry {name!r} ({dtype} {list(shape)}) spans "
                          f"{end - begin} bytes, needs {_numel(shape) * dt.itemsize}")
    return Entry(dtype, shape, path, data_start + begin, end - begin)


def _end(value) -> int:
    return int(value["data_offsets"][1])


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# --- one component folder -----------------------------------------------------------

def weight_files(folder: Path, library: str) -> tuple[list[Path] | None, list[str]]:
    """The safetensors files the loader will read (None: weights in another form, not
    inspected), and problems finding them."""
    for name in WEIGHT_FILES[library]:
        path = folder / name
        if path.is_file():
            return (_shards(path) if name.endswith(".index.json") else ([path], []))
    if any(p.name.endswith(WEIGHT_SUFFIXES) for p in folder.iterdir()):
        return None, []  # .bin, a variant or another layout: the loader decides
    single, index = sorted(WEIGHT_FILES[library], key=len)
    return [], [f"{folder}: no weight file (expected {single} or {index} with its shards)"]


def _shards(index: Path) -> tuple[list[Path], list[str]]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError):
        return [], [f"{index}: not a valid shard index (JSON with a weight_map)"]
    files = [index.parent / name for name in names]
    missing = [f"{index}: shard {p.name} is missing" for p in files if not p.is_file()]
    return [p for p in files if p.is_file()], missing


def found_tensors(files: list[Path]) -> tuple[dict[str, Entry], list[str]]:
    """Every tensor in the readable files, and problems with the others."""
    tensors: dict[str, Entry] = {}
    problems = []
    for path in files:
        try:
            tensors.update(read_header(path))
        except CorruptFile as exc:
            problems.append(f"{path}: {exc}")
        except OSError as exc:
            problems.append(f"{path}: cannot be read ({exc.strerror or exc})")
    return tensors, problems


# --- files against the model --------------------------------------------------------

def compare(model: torch.nn.Module, found: dict[str, Entry], folder: Path,
            complete: bool = True) -> list[str]:
    """Shape and dtype problems of the tensors found, and (``complete``: every file
    was read) the tensors the model needs that no file holds."""
    expected = model.state_dict(keep_vars=True)
    found = align_prefix(model, expected, found)
    problems = []
    for name, entry in found.items():
        if name in expected:
            problems += _tensor_problems(name, expected[name], entry)
    return problems + (_missing(model, expected, found, folder) if complete else [])


def _tensor_problems(name: str, want: torch.Tensor, entry: Entry) -> list[str]:
    if list(entry.shape) != list(want.shape):
        return [f"{entry.file}: tensor {name!r} has shape {list(entry.shape)}, the model "
                f"expects {list(want.shape)}"]
    dtype = torch_dtype(entry.dtype)
    if dtype is None:
        return [f"{entry.file}: tensor {name!r} has dtype {entry.dtype}, which this torch "
                "cannot load"]
    # The loader casts floats to the recipe's dtype; an integer, bool or complex tensor
    # cast into a float parameter would silently lose its meaning.
    if want.is_floating_point() and not dtype.is_floating_point:
        return [f"{entry.file}: tensor {name!r} has dtype {entry.dtype}, the model expects "
                f"a floating-point {str(want.dtype).removeprefix('torch.')}"]
    return []


def align_prefix(model, expected: dict, found: dict[str, Entry]) -> dict[str, Entry]:
    """transformers loads a file saved from a head model (keys 'model.x') into the
    bare model (keys 'x') and back, by its base_model_prefix: do the same."""
    prefix = getattr(model, "base_model_prefix", "")
    if not prefix or not found:
        return found
    dotted = prefix + "."
    model_has = any(k.startswith(dotted) for k in expected)
    file_has = any(k.startswith(dotted) for k in found)
    if file_has and not model_has:  # keys outside the base model (a head) are not loaded
        return {k.removeprefix(dotted): v for k, v in found.items() if k.startswith(dotted)}
    if model_has and not file_has:
        return {dotted + k: v for k, v in found.items()}
    return found


def _missing(model, expected: dict, found: dict[str, Entry], folder: Path) -> list[str]:
    """Tensors the model needs that no file holds. Tied weights (one tensor under two
    names, e.g. T5's shared.weight and encoder.embed_tokens.weight) count as present
    if any name is. When the file also has keys the model lacks, the loader may rename
    them (old diffusers attention names, transformers conversions): say nothing."""
    unexpected = [k for k in found if k not in expected]
    ignore = list(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ())
    if any(not any(re.search(p, k) for p in ignore) for k in unexpected):
        return []
    names: dict[int, list[str]] = {}
    for name, tensor in expected.items():
        names.setdefault(id(tensor), []).append(name)
    ignore = list(getattr(model, "_keys_to_ignore_on_load_missing", None) or ())
    missing = [group[0] for group in names.values()
               if not any(n in found for n in group)
               and not any(re.search(p, n) for p in ignore for n in group)]
    return [f"{folder}: tensor {name!r} ({list(expected[name].shape)}) is in no weight "
            "file" for name in sorted(missing)]


# --- the whole directory ------------------------------------------------------------

def configuration_problems(root: Path) -> list[str]:
    """What keeps a save_pretrained directory's model from being built at all, each
    file named: an unreadable model_index.json, a component's missing or unreadable
    config.json (the weights are ``directory_problems``' to check)."""
    index = root / "model_index.json"
    if not index.exists():  # a modular checkpoint's
        index = root / "modular_model_index.json"
    try:
        classes = abstract.module_classes(root)
    except ValueError as exc:  # JSONDecodeError: where in the file
        return [f"{index.name}: {index} is not valid JSON: {exc}"]
    except OSError as exc:
        return [f"{index.name}: {index} cannot be read: {exc.strerror or exc}"]
    except (AttributeError, IndexError, TypeError):  # JSON, but not an index's form
        return [f"{index.name}: {index} is not a diffusers pipeline index (a JSON object "
                "of component: [library, class])"]
    except Exception:  # noqa: BLE001 - a library's own failure naming a class: the
        return []      # model's build says it in its words
    out = []
    for name in classes:
        config = root / name / "config.json"
        if not config.is_file():
            out.append(f"{name}: {config} is missing ({index.name} names {name})")
            continue
        try:
            json.loads(config.read_text())
        except (OSError, ValueError) as exc:
            out.append(f"{name}: {config} cannot be read as JSON: {exc}")
    return out


def directory_problems(root: Path, elsewhere: tuple[str, ...] = ()) -> list[str]:
    """Every problem in the weight files of a save_pretrained directory, once its
    configuration reads (``configuration_problems``, else those); the components
    ``elsewhere`` (whose weights come from another file) need only their configuration."""
    found = configuration_problems(root)
    if found:
        return found
    out = []
    for name, (library, cls) in abstract.module_classes(root).items():
        if name not in elsewhere:
            out += [f"{name}: {p}" for p in component_problems(root / name, library, cls)]
    return out


def component_problems(folder: Path, library: str, cls: type) -> list[str]:
    """A component's weight files against the model its (readable) config builds."""
    files, problems = weight_files(folder, library)
    if files is None:
        return []
    found, read_problems = found_tensors(files)
    problems += read_problems
    if _quantized(folder):
        return problems  # quantized weights are packed: their shapes are not the model's
    try:
        model = abstract.from_config_dir(library, cls, folder)
    except Exception:  # the loader will give its own error; this check invents none
        return problems
    if not model.state_dict():
        return problems if files else []  # a module without weights needs no file
    if not files:
        return problems  # "no weight file" says it all: no list of every tensor
    # A missing or unreadable file would make its tensors look missing: say so once.
    return problems + compare(model, found, folder, complete=not problems)


def _quantized(folder: Path) -> bool:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "quantization_config" in config


def check(root: Path, elsewhere: tuple[str, ...] = ()) -> None:
    """Raise one LoadError listing every weight-file problem under ``root``."""
    found = directory_problems(root, elsewhere)
    if not found:
        return
    shown = "\n  ".join(found[:SHOWN])
    more = f"\n  ... and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    noun = "problem" if len(found) == 1 else "problems"
    components = sorted({p.split(":", 1)[0] for p in found})
    raise LoadError(f"{root}: {len(found)} {noun} in the weight files (found before "
                    f"loading any weights):\n  {shown}{more}",
                    hint=f"re-download {', '.join(components)}, or re-save the pipeline "
                         "with save_pretrained")


# --- identity, for the run record ---------------------------------------------------

def header_identity(path: Path) -> dict:
    """A safetensors file named cheaply: its size and its header's SHA-256 (names,
    dtypes, shapes and byte offsets of every tensor; not the data)."""
    import hashlib

    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        head = f.read(min(length, MAX_HEADER))
    return {"bytes": path.stat().st_size, "header_sha256": hashlib.sha256(head).hexdigest()}


def identity(root: Path, hub_id: str | None = None) -> dict:
    """What names this checkpoint exactly, cheaply: for a hub snapshot its id and
    revision; for every checkpoint the SHA-256 of each weight file's header (names,
    dtypes, shapes and byte offsets of every tensor) and of each JSON file (configs,
    indexes), with sizes. Tensor data is not hashed: at 14B that would take minutes."""
    import hashlib

    found: dict = {"source": "hub" if hub_id else "local", "path": str(root)}
    if hub_id is not None:
        found.update(hub_id=hub_id, revision=root.name if root.parent.name == "snapshots"
                     else None)
    files = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        name = str(path.relative_to(root))
        if path.suffix == ".safetensors":
            files[name] = header_identity(path)
        elif path.suffix == ".json":
            files[name] = {"bytes": path.stat().st_size,
                           "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        elif path.suffix in WEIGHT_SUFFIXES:
            files[name] = {"bytes": path.stat().st_size}
    found["files"] = files
    return found
