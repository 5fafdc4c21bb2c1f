"""LoRA adapters fused into the weights on the host, before dtypes, sharding and compile.

A recipe's ``lora`` section lists adapters. Each file is read the way the
pipeline's own diffusers loader reads it (``lora_state_dict``: diffusers' and
PEFT's key names, and the community formats diffusers converts), then checked
against the model: every key must name a linear layer of the component it is
applied to, with matching shapes. Each adapted layer gets

    W += scale * alpha / rank * (B @ A)      (bias += scale * alpha / rank * b)

computed in float32: the update ``pipe.load_lora_weights(...)`` then
``pipe.fuse_lora(lora_scale=scale)`` adds in diffusers (alpha and rank from the
file's adapter metadata; alpha = rank when it has none). Tensor names stay those of the base model, so every sharding and
dtype rule still matches, and a LoRA costs nothing per step.

Components read tensor by tensor from their files (``weights``) get their
updates as each tensor is read, before its cast to the recipe's dtype; the rest
(already in that dtype) are updated in place on the host.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from porter.errors import Problem, RecipeError, first_line
from porter.recipe.sources import HUB_ID
from porter.runtime import finite, notices
from porter.runtime.atomic import sha256
from porter.shims import lazy
from porter.transforms import Checking, Pass

torch = lazy.module("torch", __name__)

if TYPE_CHECKING:
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe
    from porter.transforms.building import Building

DEFAULT_WEIGHT_NAME = "pytorch_lora_weights.safetensors"
CHUNK = 1 << 20  # elements of one float32 temporary while adding an update (4 MiB)
KEY = re.compile(r"^(?P<component>[A-Za-z_]\w*)\.(?P<module>.+)\.lora_(?P<part>[AB])"
                 r"\.(?P<kind>weight|bias)$")


@dataclass
class Delta:
    """One layer's update: ``scaling * (B @ A)`` and, when the LoRA has one, a bias."""

    down: torch.Tensor  # A: (rank, in_features)
    up: torch.Tensor  # B: (out_features, rank)
    scaling: float
    bias: torch.Tensor | None = None

    def added(self, what: str, tensor: torch.Tensor, dtype: torch.dtype,
              rows: slice = slice(None)) -> torch.Tensor:
        """``tensor`` (rows ``rows`` of the weight or bias) plus its update, computed in
        float32 and stored in ``dtype``. A weight goes through in slices of rows: full-size
        float32 temporaries, made in the loading threads at once, would stay with the
        allocator as host memory (measured: +1.4 GiB peak for a rank-16 LoRA on Wan 1.3B)."""
        out = torch.empty(tensor.shape, dtype=dtype)
        if what == "bias":
            return out.copy_(tensor.float().add_(self.bias[rows].float(), alpha=self.scaling))
        up, down = self.up[rows].float(), self.down.float()
        step = max(1, CHUNK // max(1, tensor.shape[1]))
        for start in range(0, tensor.shape[0], step):
            part = slice(start, start + step)
            out[part] = tensor[part].float().addmm_(up[part], down, alpha=self.scaling)
        return out

    def plus(self, other: "Delta") -> "Delta":
        """Two adapters on one layer: their updates side by side (rank adds up)."""
        down = torch.cat([self.down.float() * self.scaling, other.down.float() * other.scaling])
        up = torch.cat([self.up.float(), other.up.float()], dim=1)
        bias = None
        if self.bias is not None or other.bias is not None:
            bias = sum(d.bias.float() * d.scaling for d in (self, other) if d.bias is not None)
        return Delta(down, up, 1.0, bias)


@dataclass
class Adapter:
    """One recipe adapter as read: its file, digest and per-layer updates."""

    index: int
    file: Path
    sha256: str  # of the file as it was read
    scale: float
    components: list[str]
    #: component -> module name -> update
    deltas: dict[str, dict[str, Delta]]

    def described(self) -> dict:
        """What the run record (and each stage made with it) says about it."""
        return {"file": str(self.file), "sha256": self.sha256, "scale": self.scale,
                "components": self.components,
                "modules": sum(len(m) for m in self.deltas.values())}


def locate(recipe: Recipe, index: int, fetch: bool = True) -> Path | None:
    """The adapter's safetensors file: a file, a folder holding one, or a hub id
    (without ``fetch``, from the local cache only: None when it is not there)."""

    spec = recipe.lora[index]
    name = spec.weight_name or DEFAULT_WEIGHT_NAME
    path = recipe.file_path(f"lora.{index}.file", spec.file)
    if path.is_file():
        return path
    if path.is_dir():
        if (path / name).is_file():
            return path / name
        found = sorted(p.name for p in path.glob("*.safetensors"))
        raise RecipeError([recipe.problem(
            f"lora.{index}.weight_name", f"{str(path)!r} holds no {name!r}",
            hint=f"weight_name: one of {', '.join(found)}" if found
            else "that folder holds no .safetensors file")])
    if HUB_ID.match(spec.file) and not spec.file.startswith((".", "/", "~")):
        from huggingface_hub import hf_hub_download
        try:
            return Path(hf_hub_download(spec.file, name, local_files_only=not fetch))
        except Exception as exc:  # network, missing repository or file, offline cache
            if not fetch:
                return None
            raise RecipeError([recipe.problem(
                f"lora.{index}.file", f"cannot fetch {name!r} from {spec.file!r}: "
                f"{first_line(exc)}",
                hint="download it once elsewhere and give the local file, or set "
                     "weight_name to the file's name in that repository")]) from None
    raise RecipeError([recipe.problem(
        f"lora.{index}.file", f"{spec.file!r} is not a file, a folder or a hub id (org/name)",
        hint=recipe.relative_paths(f"lora.{index}.file"))])


def read(recipe: Recipe, index: int, pipeline_class, modules: dict,
         fetch: bool = True) -> tuple[Adapter | None, list[Problem]]:
    """Adapter ``index`` read with the pipeline's own LoRA loader and checked against
    ``modules`` (component -> torch module, weights may be on the meta device).
    Without ``fetch``, a hub file not in the local cache is left for the run to fetch
    and check (a notice says so)."""
    spec = recipe.lora[index]
    where = f"lora.{index}"
    transformers = [n for n, m in modules.items()
                    if n.startswith("transformer") and isinstance(m, torch.nn.Module)]
    wrong = [c for c in spec.components if c not in transformers]
    if wrong:
        return None, [recipe.problem(f"{where}.components", f"{wrong[0]!r} is not a "
                                     "transformer of this model",
                                     hint="components: " + ", ".join(transformers))]
    loader = getattr(pipeline_class, "lora_state_dict", None)
    if loader is None:
        return None, [recipe.problem(where, f"{pipeline_class.__name__} has no LoRA loader "
                                     "in diffusers", hint="leave lora out for this model")]
    path = locate(recipe, index, fetch)
    if path is None:
        notices.warn(f"lora.{index}: {spec.weight_name or DEFAULT_WEIGHT_NAME} from "
                     f"{spec.file} is not in the local hub cache: the run fetches it and "
                     "checks it against the model then")
        return None, []
    try:
        digest = sha256(path)  # before reading: the record must name what was read
        state, metadata = loader(str(path), return_lora_metadata=True)
    except Exception as exc:  # the library's message says what it could not read
        return None, [recipe.problem(f"{where}.file", f"{path}: not a LoRA file diffusers "
                                     f"can read: {first_line(exc)}", hint="give a LoRA .safetensors "
                                     "file (diffusers, PEFT, or a format diffusers converts)")]
    problems = _content_problems(recipe, where, path, state)
    if problems:
        return None, problems
    config = _config(metadata)
    pairs, problems = _pairs(recipe, where, path, state, config)
    layers = {c: dict(modules[c].named_modules()) for c in spec.components}
    deltas: dict[str, dict[str, Delta]] = {c: {} for c in spec.components}
    for module_name, (down, up, bias) in pairs.items():
        for component in spec.components:
            found = _fit_problem(layers[component], module_name, down, up, bias)
            if found:
                message, hint = found
                into = "" if component == "transformer" else f" (applied to {component})"
                problems.append(recipe.problem(f"{where}.file", f"{path.name}: "
                                               f"transformer.{module_name}{into}: {message}",
                                               hint=hint))
                break  # one report a layer
            scaling = spec.scale * _scaling(config, module_name, down.shape[0])
            deltas[component][module_name] = Delta(down, up, scaling, bias)
    if problems:
        return None, problems
    return Adapter(index, path, digest, spec.scale, list(spec.components), deltas), []


def _content_problems(recipe: Recipe, where, path, state: dict) -> list[Problem]:
    """An adapter that would change nothing (no tensors), or whose values are NaN or
    infinite: fused, those would be blamed on the checkpoint's weights."""

    if not state:
        return [recipe.problem(f"{where}.file", f"{path}: holds no tensors, so the "
                               "adapter would change nothing",
                               hint="the file is empty or was saved without its weights: "
                                    "save the adapter again, or leave it out")]
    bad = {key: (count, tensor.numel()) for key, tensor in state.items()
           if isinstance(tensor, torch.Tensor) and (count := finite.count(tensor))}
    if not bad:
        return []
    shown = ", ".join(f"{key} ({count} of {total})" for key, (count, total)
                      in list(bad.items())[:4])
    more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
    return [recipe.problem(f"{where}.file", f"{path}: NaN or infinite values in {len(bad)} "
                           f"tensor(s) of the adapter: {shown}{more}",
                           hint="the adapter file is damaged or was saved from a diverged "
                                "training run; model.allow_nonfinite covers the checkpoint's "
                                "weights, not an adapter's")]


def _config(metadata: dict | None) -> dict:
    """The adapter's LoRA settings from the file's metadata (keys as diffusers saves
    them: ``transformer.r``, ``transformer.lora_alpha``, ...)."""
    if not metadata:
        return {}
    return {key.removeprefix("transformer."): value for key, value in metadata.items()
            if key.startswith("transformer.")}


def _scaling(config: dict, module: str, rank: int) -> float:
    """alpha / rank for one layer, as PEFT computes it (alpha = rank without metadata)."""
    if not config:
        return 1.0
    alpha = config.get("lora_alpha", 8)  # PEFT's LoraConfig default
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            alpha = value
            break
    if config.get("use_rslora"):
        return alpha / math.sqrt(rank)
    return alpha / rank


def _pairs(recipe: Recipe, where, path, state, config) -> tuple[dict, list[Problem]]:
    """module name -> (A, B, bias or None) from a diffusers-format state dict."""
    problems, parts = [], {}
    if config.get("use_dora") or any("lora_magnitude_vector" in k for k in state):
        return {}, [recipe.problem(f"{where}.file", f"{path.name}: a DoRA adapter (magnitude "
                                   "vectors) cannot be fused as a plain update",
                                   hint="use a LoRA without DoRA")]
    foreign = [key for key in state if not _transformer_key(key)]
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        problems.append(recipe.problem(
            f"{where}.file", f"{path.name}: key {foreign[0]!r}{more} is not a transformer "
            "LoRA weight", hint="Porter fuses transformer LoRAs as diffusers loads them "
            "(transformer.<module>.lora_A / lora_B, or a format diffusers converts to "
            "that); text-encoder LoRAs and LoKr adapters are not supported"))
    for key, tensor in state.items():
        match = _transformer_key(key)
        if match is None:
            continue  # reported above
        if match["kind"] == "bias" and match["part"] == "A":
            problems.append(recipe.problem(f"{where}.file", f"{path.name}: {key!r}: a bias "
                                           "on lora_A is not a LoRA diffusers loads"))
            continue
        parts.setdefault(match["module"], {})[(match["part"], match["kind"])] = tensor
    pairs = {}
    for module, found in sorted(parts.items()):
        down, up = found.get(("A", "weight")), found.get(("B", "weight"))
        if down is None or up is None:
            missing = "lora_A" if down is None else "lora_B"
            problems.append(recipe.problem(f"{where}.file", f"{path.name}: transformer."
                                           f"{module} has no {missing}.weight",
                                           hint="the file is incomplete"))
            continue
        pairs[module] = (down, up, found.get(("B", "bias")))
    return pairs, problems


def _transformer_key(key: str):
    match = KEY.match(key)
    return match if match is not None and match["component"] == "transformer" else None


def _fit_problem(modules: dict, name: str, down, up, bias) -> tuple[str, str] | None:
    """Why this LoRA layer does not fit the model whose ``named_modules`` are
    ``modules`` (message, hint), or None."""
    layer = modules.get(name)
    if layer is None:
        close = difflib.get_close_matches(name, list(modules), n=1, cutoff=0.6)
        return ("matches no module of the model",
                f"closest module: {close[0]}" if close else "a LoRA for another model?")
    if not isinstance(layer, torch.nn.Linear):
        return (f"is a {type(layer).__name__}, not a Linear layer",
                "Porter fuses LoRAs of linear layers")
    expected = ((down.shape[0], layer.in_features), (layer.out_features, down.shape[0]))
    if down.ndim != 2 or up.ndim != 2 or tuple(down.shape) != expected[0] \
            or tuple(up.shape) != expected[1]:
        return (f"shapes A {tuple(down.shape)} and B {tuple(up.shape)} do not fit a "
                f"{layer.in_features} -> {layer.out_features} layer (want A {expected[0]}, "
                f"B {expected[1]})", "a LoRA trained for another model size?")
    if bias is not None:
        if layer.bias is None:
            return ("carries a bias update but the layer has no bias", "a LoRA for "
                    "another model?")
        if tuple(bias.shape) != (layer.out_features,):
            return (f"bias shape {tuple(bias.shape)} does not fit {layer.out_features} "
                    "outputs", "a LoRA for another model?")
    return None


def digests(recipe: Recipe) -> list[dict]:
    """Each adapter's file and SHA-256 as it is on disk now (nothing else read): what
    a saved stage made with the adapters is checked against."""
    found = []
    for index in range(len(recipe.lora)):
        path = locate(recipe, index)
        try:
            found.append({"file": str(path), "sha256": sha256(path)})
        except OSError as exc:
            raise RecipeError([recipe.problem(f"lora.{index}.file", f"{path}: cannot be "
                                              f"read: {exc.strerror or exc}")]) from None
    return found


def read_all(recipe: Recipe, pipeline_class, modules: dict,
             fetch: bool = True) -> list[Adapter]:
    """Every adapter of the recipe, checked; every problem of every adapter at once."""
    adapters, problems = [], []
    for index in range(len(recipe.lora)):
        adapter, found = read(recipe, index, pipeline_class, modules, fetch)
        problems += found
        if adapter is not None:
            adapters.append(adapter)
    if problems:
        raise RecipeError(problems)
    return adapters


def combined(adapters: list[Adapter]) -> dict[str, dict[str, Delta]]:
    """component -> module -> the sum of every adapter's update for it."""
    total: dict[str, dict[str, Delta]] = {}
    for adapter in adapters:
        for component, deltas in adapter.deltas.items():
            into = total.setdefault(component, {})
            for module, delta in deltas.items():
                into[module] = into[module].plus(delta) if module in into else delta
    return total


def tensor_updates(deltas: dict[str, Delta]) -> dict[str, tuple[str, Delta]]:
    """Updates by parameter name: ('weight' or 'bias', the layer's update)."""
    found = {}
    for module, delta in deltas.items():
        found[f"{module}.weight"] = ("weight", delta)
        if delta.bias is not None:
            found[f"{module}.bias"] = ("bias", delta)
    return found


def fuse_in_place(model: torch.nn.Module, deltas: dict[str, Delta]) -> None:
    """Add each update to a module whose weights are in host memory (float32 math)."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, (what, delta) in tensor_updates(deltas).items():
            param = params[name]
            param.copy_(delta.added(what, param, param.dtype))


def apply(family: ModelFamily, recipe: Recipe, pipe, weights: dict) -> list[dict]:
    """Read and check the recipe's adapters against ``pipe`` (before any compute), then
    fuse them: into ``weights[component]`` for components read tensor by tensor, in
    place for the rest. Returns the run record's entries."""
    if not recipe.lora:
        return []
    modules = {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    adapters = read_all(recipe, family.pipeline_class(recipe), modules)
    for component, deltas in combined(adapters).items():
        if component in weights:
            weights[component].deltas = tensor_updates(deltas)
        else:
            fuse_in_place(modules[component], deltas)
    return [adapter.described() for adapter in adapters]


def _apply(b: Building) -> None:
    b.lora = apply(b.family, b.recipe, b.pipe, b.load.weights)  # before any dtype cast


def _detail(c: Checking) -> str | None:
    return ", ".join(f"{spec.file} x{spec.scale}" for spec in c.recipe.lora) or None


# its adapters are checked against the model by `validate` (porter.port.checks) and when
# fused, not in every shape check: reading them means hashing their files
PASS = Pass(
    "lora", ("lora",), "fuse LoRA adapters into the weights, before any dtype cast",
    apply=_apply, detail=_detail)
