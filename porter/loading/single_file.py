"""``model.transformer``, ``model.vae``, ``model.text_encoder``: a component's weights
from one file, as users hold them: a ``.safetensors`` file or a PyTorch checkpoint
(``.pth``, as the original Wan release ships its VAE and text encoder), in diffusers'
(or transformers') key names or the original release's (converted by the converter
the family names for that component), in bfloat16, float16, float32 or float8 e4m3
(cast, or scaled with a ``<layer>.scale_weight`` per weight).

Nothing is loaded to check or to locate the file: a safetensors header, or a
checkpoint's pickle (``pickled``), gives every tensor's name, dtype, shape and place
(but one fp8 tensor of a file without scales is read: scaled fp8 that lost its scales
shows in any of its weights). The converter runs on stand-ins of the header's shapes
(meta tensors), so each of the module's tensors is matched to the one it comes from
in the file; placement then reads them tensor by tensor, straight into their shards,
as it reads a diffusers checkpoint (``weights.ComponentWeights``), each scaled fp8
weight multiplied by its scale as it is read.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from porter.errors import LoadError, UsageError
from porter.loading import checkpoints, pickled
from porter.loading.weights import SCALES_LOST, ComponentWeights, cast_fp8_problem
from porter.shims import lazy
from porter.shims.walk import tensor_slots

torch = lazy.module("torch", __name__)

if TYPE_CHECKING:
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe

#: a scaled fp8 file's marker tensor (ComfyUI's) and each weight's scale, by suffix
MARKER = "scaled_fp8"
SCALE = "scale_weight"
#: the components a recipe may give a file of their own (``model.<component>``)
COMPONENTS = ("transformer", "vae", "text_encoder")
#: a transformer in shards: the index that names them
INDEX = ".safetensors.index.json"
#: the prefix some single files put before every key
PREFIXES = ("model.diffusion_model.", "diffusion_model.")
SHOWN = 8


class Refusal(NamedTuple):
    """One thing wrong with a file against the model, and what to do about it."""

    text: str
    hint: str


def given(recipe: Recipe) -> dict[str, Path]:
    """component -> the file the recipe gives its weights in (``model.<component>``),
    from the current directory as ``model.source`` is."""
    files = {}
    for name in COMPONENTS:
        value = getattr(recipe.model, name)
        if value:
            try:
                files[name] = Path(value).expanduser()
            except RuntimeError:  # '~name/...' for a user this machine does not have
                raise UsageError(f"model.{name}: cannot expand {value.split('/')[0]!r}: no "
                                 "such user", hint="write the path out in full") from None
    return files


def read_header(path: Path) -> dict:
    """Tensor name -> ``checkpoints.Entry``, from a safetensors header (or the headers
    of the shards an index names) or a PyTorch checkpoint's pickle (CorruptFile when
    none reads)."""
    if path.suffix in pickled.SUFFIXES:
        return pickled.read_entries(path)
    if path.name.endswith(INDEX):
        entries = {}
        for shard in _shards(path):
            entries.update(checkpoints.read_header(shard))
        return entries
    return checkpoints.read_header(path)


def _shards(index: Path) -> list[Path]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        return [index.parent / name for name in sorted(set(weight_map.values()))]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise checkpoints.CorruptFile("not a safetensors index (no weight_map of tensor "
                                      "-> shard file)") from None


def identity(path: Path) -> dict:
    """The file named cheaply, for run.json and for resuming (nothing of the data)."""
    if path.suffix in pickled.SUFFIXES:
        return pickled.identity(path)
    if path.name.endswith(INDEX):
        shards = [checkpoints.header_identity(shard) for shard in _shards(path)]
        digest = hashlib.sha256(json.dumps(shards).encode()).hexdigest()
        return {"bytes": sum(shard["bytes"] for shard in shards), "header_sha256": digest}
    return checkpoints.header_identity(path)


def file_problems(path: Path) -> list[str]:
    """What is wrong with the file itself (readable without loading anything)."""
    if not path.is_file():
        return [f"{path} is not a file"]
    if path.suffix not in (".safetensors", *pickled.SUFFIXES) and not path.name.endswith(INDEX):
        return [f"{path} is neither a .safetensors file (or a {INDEX} of shards) nor a "
                "PyTorch checkpoint (.pth, .pt)"]
    try:
        read_header(path)
    except (OSError, checkpoints.CorruptFile) as exc:
        return [f"{path}: {exc}"]
    return []


def located(path: Path, module: torch.nn.Module, converter=None,
            key: str = "model.transformer") -> ComponentWeights:
    """Where each of ``module``'s tensors lies in the file (LoadError naming every
    tensor that is missing, unexpected, of another shape, or fp8 without its scale)."""
    weights, problems = _located(path, module, converter)
    if problems:
        shown = "\n  ".join(problem.text for problem in problems[:SHOWN])
        more = f"\n  ... and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
        hints = dict.fromkeys(problem.hint for problem in problems[:SHOWN])
        raise LoadError(f"{key} {path}: {len(problems)} problem(s) against the "
                        f"model's {type(module).__name__}:\n  {shown}{more}",
                        hint="; ".join(hints))
    return weights


def problems(path: Path, module: torch.nn.Module, converter=None) -> list[Refusal]:
    """``located``'s problems, each with its hint, for ``validate``."""
    found = [Refusal(problem, "a .safetensors file or a PyTorch checkpoint (.pth)")
             for problem in file_problems(path)]
    return found or _located(path, module, converter)[1]


def _located(path: Path, module, converter) -> tuple[ComponentWeights | None,
                                                    list[Refusal]]:
    header = read_header(path)
    header = {_unprefixed(name): entry for name, entry in header.items()}
    marked = header.pop(MARKER, None) is not None
    scales = {name: header.pop(name) for name in [n for n in header
                                                  if n.endswith("." + SCALE)]}
    expected = module.state_dict(keep_vars=True)
    names = _converted(header, expected, converter)
    kind = type(module).__name__
    other = f"is it this model's {kind} (the same variant and size as model.source's)?"
    if isinstance(names, str):
        return None, [Refusal(names, f"is it a {kind}, in diffusers' key names or the "
                              "original release's?" if "cannot convert" in names else
                              "convert it with diffusers (from_single_file, then "
                              "save_pretrained) and give the .safetensors it writes")]
    found: list[Refusal] = []
    entries, scale_of = {}, {}
    for name, original in names.items():
        if name not in expected:
            found.append(Refusal(f"{original}: the model has no tensor {name!r}", other))
            continue
        entry = header[original]
        if tuple(entry.shape) != tuple(expected[name].shape):
            found.append(Refusal(f"{original}: shape {list(entry.shape)}, the model's "
                                 f"{name} is {list(expected[name].shape)}", other))
        if checkpoints.torch_dtype(entry.dtype) is None:
            found.append(Refusal(f"{original}: dtype {entry.dtype} cannot be loaded",
                                 "save it in bfloat16, float16, float32 or float8 e4m3"))
        scale = original[:-len("weight")] + SCALE if original.endswith("weight") else None
        if scale in scales:
            scale_of[name] = scales.pop(scale)
        elif entry.dtype.startswith("F8") and (marked or scales or scale_of):
            found.append(Refusal(f"{original}: fp8 with no {SCALE} in a scaled fp8 file "
                                 "(loaded as if unscaled, its values would be wrong)",
                                 f"the file has lost this weight's {SCALE}: use the file "
                                 f"as published, each fp8 weight beside its {SCALE}"))
        entries[name] = entry
    found += [Refusal(f"{name}: a scale with no weight", f"the file lacks the weight of "
                      f"this {SCALE}: is it this model's {kind}, whole?") for name in scales]
    _shared(expected, entries, scale_of)
    found += [Refusal(f"{name}: not in the file", other) for name, tensor in expected.items()
              if name not in entries and tensor.is_meta]
    weights = ComponentWeights(entries, scales=scale_of)
    weights.read_as = _read_as(entries, scale_of, names, converter)
    if not scale_of and not marked:
        found += _cast_problems(weights, names)
    return weights, found


def _cast_problems(weights: ComponentWeights, names: dict) -> list[Refusal]:
    """A file of fp8 weights with no scales at all: a cast, or scaled fp8 whose scales
    (and marker) are gone. The second reads as a cast and gives latents ~1e9 too large,
    finite; every scaled weight holds the format's largest value, so one weight, the
    smallest, is read to tell them apart (``weights.cast_fp8_problem``)."""
    fp8 = [name for name, entry in weights.entries.items() if entry.dtype.startswith("F8")
           and checkpoints.torch_dtype(entry.dtype) is not None]
    if not fp8:
        return []
    name = min(fp8, key=lambda n: weights.entries[n].nbytes)
    problem = cast_fp8_problem(weights.stored(name))
    weights.read_bytes = 0  # a check, not the run's reading
    return [Refusal(f"{names.get(name, name)}: {problem}", SCALES_LOST)] if problem else []


def _read_as(entries: dict, scale_of: dict, names: dict, converter) -> dict:
    """What the file was read as, for the run record: its format and whose key names."""
    dtypes = sorted({str(checkpoints.torch_dtype(e.dtype) or e.dtype).removeprefix("torch.")
                     for e in entries.values()})
    if scale_of:
        per_row = any(math.prod(entry.shape) > 1 for entry in scale_of.values())
        form = f"scaled fp8, a {SCALE} per {'row' if per_row else 'weight'}"
    else:
        form = "fp8 cast" if any(e.dtype.startswith("F8") for e in entries.values()) \
            else "unquantized"
    renamed = converter is not None and any(name != original for name, original
                                            in names.items())
    return {"format": form, "dtypes": dtypes,
            "names": f"the original release's, converted by {converter.__name__}"
            if renamed else "the model's own"}


def _shared(expected: dict, entries: dict, scale_of: dict) -> None:
    """A tensor the module holds under several names (tied weights: UMT5's ``shared``
    and ``encoder.embed_tokens``) is read from the file under whichever it has."""
    names: dict[int, list[str]] = {}
    for name, tensor in expected.items():
        names.setdefault(id(tensor), []).append(name)
    for group in names.values():
        found = next((name for name in group if name in entries), None)
        for name in group if found else ():
            entries.setdefault(name, entries[found])
            if found in scale_of:
                scale_of.setdefault(name, scale_of[found])


def _unprefixed(name: str) -> str:
    for prefix in PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def _converted(header: dict, expected: dict, converter) -> dict[str, str] | str:
    """The module's name of each of the file's tensors -> the file's name: the same
    where the file uses diffusers' names, else the converter's renaming, found by
    running it on stand-ins (a converter that splits or reshapes a tensor is refused:
    such a tensor could not be read straight into its shards)."""
    if converter is None or all(name in expected for name in header):
        return {name: name for name in header}
    stand_ins = {name: torch.empty(entry.shape, device="meta") for name, entry in
                 header.items()}
    original = {id(tensor): name for name, tensor in stand_ins.items()}
    try:
        converted = converter(dict(stand_ins))
    except Exception as exc:  # a third-party converter: say which, and what it said
        return f"{converter.__name__} cannot convert it: {type(exc).__name__}: {exc}"
    reshaped = [name for name, tensor in converted.items() if id(tensor) not in original]
    if reshaped:
        return (f"{converter.__name__} reshapes {', '.join(reshaped[:4])}: such a file is "
                "not read yet")
    return {name: original[id(tensor)] for name, tensor in converted.items()}


def converter_of(family: ModelFamily, component: str = "transformer"):
    """The family's converter of the original release's key names for ``component``:
    a function of diffusers' (named by a string) or of the family's own, or None."""
    converter = family.single_file_converters.get(component)
    if not isinstance(converter, str):
        return converter
    from diffusers.loaders import single_file_utils  # lazy: diffusers is heavy

    return getattr(single_file_utils, converter)


def materialize(module: torch.nn.Module, weights: ComponentWeights, dtype) -> None:
    """Every tensor ``weights`` locates, read into ``module`` on the host (``porter
    verify`` keeps a PyTorch copy of the model as the file gives it)."""
    for name, held in tensor_slots(module).items():
        if name in weights.entries:
            store, key = held[0]
            value = weights.read(name, dtype)
            if isinstance(store[key], torch.nn.Parameter):
                value = torch.nn.Parameter(value, requires_grad=False)
            for store, key in held:
                store[key] = value

