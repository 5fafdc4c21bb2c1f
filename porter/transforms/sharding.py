"""Weight, input and activation sharding from the recipe's ``sharding`` section.

Rules are checked against tensor shapes alone, so the same code serves
``porter plan`` and ``porter validate`` (modules on the meta device, no
weights) and a real run (tensors placed on the mesh with ``jax.device_put``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from porter.errors import Problem
from porter.families import wan_vae
from porter.recipe.schema import ActivationRule
from porter.shims import lazy
from porter.shims.interop import NARROWED
from porter.transforms.sketch import dtype_name, itemsize

torch = lazy.module("torch", __name__)

if TYPE_CHECKING:
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe
    from porter.runtime import Runtime


@dataclass(frozen=True)
class Assignment:
    """Which rule placed one tensor, and how."""

    name: str
    shape: tuple[int, ...]
    itemsize: int
    rule: int | None  # index of the first matching rule; None: replicated
    spec: tuple  # one entry per dimension: None, an axis, or a tuple of axes

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    def split(self, axes: dict[str, int]) -> int:
        """Into how many pieces the tensor is cut (1 when replicated)."""
        return math.prod(axes[a] for entry in self.spec for a in _axes_of(entry))

    def bytes_per_device(self, axes: dict[str, int]) -> int:
        return self.nbytes // self.split(axes)


def _axes_of(entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (list, tuple)) else (entry,)


def normalize(spec) -> tuple:
    return tuple(tuple(e) if isinstance(e, list) else e for e in spec)


#: first in an activation rule's spec: the leading axes of the output, whatever their
#: number, stay whole (one rule for a VAE's 4-D and 5-D feature maps alike)
LEADING = "..."


def aligned(spec, ndim: int) -> tuple | None:
    """``spec`` for an output of ``ndim`` axes: a leading ``"..."`` becomes as many
    ``None`` as the axes the rest does not name; None where the output has fewer axes
    than the rest names (nothing to constrain)."""
    spec = normalize(spec)
    if not spec or spec[0] != LEADING:
        return spec
    rest = spec[1:]
    return None if ndim < len(rest) else (None,) * (ndim - len(rest)) + rest


def device_itemsize(dtype) -> int:
    """Bytes of one value of ``dtype`` (torch's, or its name) as it will be on a device."""
    name = dtype_name(dtype)
    return itemsize(NARROWED.get(name, name))


def assign(tensors, rules) -> list[Assignment]:
    """First matching rule for each (name, tensor), a torch tensor or a sketched one;
    unmatched are replicated."""
    compiled = [re.compile(rule.match) for rule in rules]
    out = []
    for name, tensor in tensors:
        index = next((i for i, rx in enumerate(compiled) if rx.fullmatch(name)), None)
        spec = normalize(rules[index].spec) if index is not None else ()
        itemsize = device_itemsize(tensor.dtype)
        out.append(Assignment(name, tuple(tensor.shape), itemsize, index, spec))
    return _scales_follow(out)


def _scales_follow(assignments: list[Assignment]) -> list[Assignment]:
    """A quantized weight's scales (``<layer>.weight_scale``, one per row of
    ``<layer>.weight``) are split as the weight's rows are, whatever rule matched them:
    each device holds its rows' scales, and a process reads a weight's rows and their
    scales together (``placement``)."""
    by_name = {a.name: a for a in assignments}
    out = []
    for a in assignments:
        of = by_name.get(a.name.removesuffix("_scale")) \
            if a.name.endswith(".weight_scale") else None
        if of is not None and len(a.shape) == 1 and of.shape[:1] == a.shape:
            a = Assignment(a.name, a.shape, a.itemsize, None, of.spec[:1])
        out.append(a)
    return out


def rule_problems(recipe: Recipe) -> list[Problem]:
    """Checks that need neither shapes nor devices: regexes and axis names."""
    problems, axes = [], set(recipe.mesh)
    sections = [("weights", recipe.sharding.weights, "match"),
                ("activations", recipe.sharding.activations, "module")]
    for section, per_component, key in sections:
        for component, rules in per_component.items():
            for i, rule in enumerate(rules):
                where = f"sharding.{section}.{component}.{i}"
                try:
                    re.compile(getattr(rule, key))
                except re.error as exc:
                    problems.append(recipe.problem(f"{where}.{key}",
                                                   f"invalid regex: {exc}"))
                spec = rule.spec
                if section == "activations" and spec[:1] == [LEADING]:
                    spec = spec[1:]  # the leading axes, left whole
                problems += _axis_problems(recipe, f"{where}.spec", spec, axes)
    for arg, spec in recipe.sharding.inputs.items():
        problems += _axis_problems(recipe, f"sharding.inputs.{arg}", spec, axes)
    return problems


def _axis_problems(recipe: Recipe, path, spec, axes) -> list[Problem]:
    used = [a for entry in spec for a in _axes_of(entry)]
    problems = [recipe.problem(path, f"mesh has no axis {a!r}",
                               hint=f"mesh axes: {', '.join(sorted(axes))}" + (
                                   f"; {LEADING!r} (the leading axes left whole) goes "
                                   "first in an activation rule's spec only"
                                   if a == LEADING else ""))
                for a in used if a not in axes]
    if len(set(used)) != len(used):
        problems.append(recipe.problem(path, "an axis is used twice in one spec"))
    return problems


def human_bytes(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def human_flops(n: float) -> str:
    """FLOPs in the unit that reads best: "1.23 TFLOP", "45.6 GFLOP", "12 FLOP"."""
    return _scaled(n, (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6),
                       ("kFLOP", 1e3), ("FLOP", 1.0)))


def human_seconds(s: float) -> str:
    """Seconds as "1.23 s", "12.3 ms" or "6.45 µs"."""
    return _scaled(s, (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)))


def _scaled(value: float, units: tuple) -> str:
    """``value`` to 3 significant digits in the largest of ``units`` (name, scale; the
    largest first) it reaches once rounded (999.96 ms is "1 s", not "1e+03 ms")."""
    for unit, scale in units:
        shown = float(f"{value / scale:.3g}")
        if shown >= 1:
            break
    return f"{shown:g} {unit}"  # below the smallest unit: in it


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def shape_problems(recipe: Recipe, component: str, assignments: list[Assignment],
                   axes: dict[str, int]) -> list[Problem]:
    """Spec length, divisibility, rules matching nothing, large replicated tensors."""
    rules = recipe.sharding.weights.get(component, [])
    problems, seen = [], {}
    for a in assignments:
        if a.rule is None:
            continue
        path = f"sharding.weights.{component}.{a.rule}.spec"
        if len(a.spec) > len(a.shape):
            problems.append(recipe.problem(path, f"{component}: {a.name} has {len(a.shape)} "
                                           f"dims {list(a.shape)}, spec has {len(a.spec)}"))
            continue
        for dim, entry in enumerate(a.spec):
            size = math.prod(axes[x] for x in _axes_of(entry) if x in axes)
            if a.shape[dim] % size == 0:
                continue
            key = (a.rule, dim, a.shape[dim])
            if key in seen:  # one message per rule and dimension, not per block
                seen[key] += 1
                continue
            seen[key] = 0
            fits = [d for d in _divisors(a.shape[dim]) if d <= math.prod(axes.values())]
            problems.append((key, recipe.problem(
                path, f"{component}: {a.name} shape {list(a.shape)}: dim {dim} "
                f"({a.shape[dim]}) does not divide by {entry}={size}",
                hint=f"axis sizes that divide it: {', '.join(map(str, fits))}")))
    problems = [_with_count(p, seen) for p in problems]
    matched = {a.rule for a in assignments}
    for i, rule in enumerate(rules):
        if i not in matched:
            problems.append(recipe.problem(
                f"sharding.weights.{component}.{i}.match",
                f"{component}: rule {rule.match!r} matches no tensor (a typo?)",
                hint="`porter inspect` lists tensor names; earlier rules win"))
    limit = recipe.sharding.report_replicated_mb * 2**20
    large = [a for a in assignments if a.split(axes) == 1 and a.nbytes > limit]
    if rules and large and math.prod(axes.values()) > 1:
        names = ", ".join(f"{a.name} ({human_bytes(a.nbytes)})" for a in large[:5])
        problems.append(recipe.problem(
            f"sharding.weights.{component}",
            f"{component}: {len(large)} large tensors are replicated on every device: {names}",
            hint="add a rule for them, or raise sharding.report_replicated_mb"))
    return problems


def _with_count(item, seen) -> Problem:
    if isinstance(item, Problem):
        return item
    key, problem = item
    if not seen[key]:
        return problem
    return Problem(problem.path, f"{problem.message} (and {seen[key]} more tensors)",
                   problem.file, problem.line, problem.hint)


def input_problems(recipe: Recipe, shapes: dict[str, tuple[int, ...]],
                   axes: dict[str, int]) -> list[Problem]:
    """Each sharded transformer input must exist and divide by its axes."""
    if not shapes:
        return []  # the family cannot tell the shapes (e.g. generic): nothing to check
    problems = []
    for arg, spec in recipe.sharding.inputs.items():
        path = f"sharding.inputs.{arg}"
        if arg not in shapes:
            known = ", ".join(shapes) or "none known"
            problems.append(recipe.problem(path, f"the transformer has no input {arg!r}",
                                           hint=f"inputs: {known}"))
            continue
        shape = shapes[arg]
        if len(spec) > len(shape):
            problems.append(recipe.problem(path, f"{arg} has {len(shape)} dims {list(shape)}, "
                                           f"spec has {len(spec)}"))
            continue
        for dim, entry in enumerate(normalize(spec)):
            size = math.prod(axes[x] for x in _axes_of(entry) if x in axes)
            if shape[dim] % size:
                hint = ("set generate.cfg_parallel: true to batch the two guidance passes"
                        if dim == 0 and shape[0] == 1 else "change the mesh or the spec")
                problems.append(recipe.problem(
                    path, f"{arg} shape {list(shape)}: dim {dim} ({shape[dim]}) does not "
                    f"divide by {entry}={size}", hint=hint))
    return problems


def partition_spec(spec):
    from jax.sharding import PartitionSpec
    return PartitionSpec(*normalize(spec))


def _constrain(tensor, sharding):
    if tensor.device.type == "meta":  # shapes only (porter compile's dry runs)
        return tensor
    import jax
    from torchax.interop import call_jax
    return call_jax(jax.lax.with_sharding_constraint, tensor, sharding)


def constrain_activations(module: torch.nn.Module, runtime: Runtime, rules) -> list:
    """Constrain matching modules' outputs (the first output of a tuple) to a spec
    (``aligned`` to the output's axes).

    Applied as forward hooks, so they act while the compiled graph is traced.
    Returns the hook handles (``handle.remove()`` undoes one).
    """
    from jax.sharding import NamedSharding

    handles = []
    for name, sub in module.named_modules():
        rule = next((r for r in rules if re.fullmatch(r.module, name)), None)
        if rule is None:
            continue

        def constrained(tensor, spec=rule.spec):
            fitted = aligned(spec, tensor.ndim)
            if fitted is None:
                return tensor
            return _constrain(tensor, NamedSharding(runtime.mesh, partition_spec(fitted)))

        def hook(_module, _inputs, output, constrained=constrained):
            if isinstance(output, torch.Tensor):
                return constrained(output)
            if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
                return (constrained(output[0]),) + output[1:]
            return output
        handles.append(sub.register_forward_hook(hook))
    return handles


#: the components that are a video's VAE (``vae``, ``vae_2``; not an ``audio_vae``)
VIDEO_VAE = r"vae(_\d+)?"
#: the blocks of a diffusers VAE's encoder and decoder (Wan's, CogVideoX's, Hunyuan's,
#: LTX's, the image VAE's): each one's output is a feature map, (..., height, width)
VAE_BLOCKS = r"(en|de)coder\.(conv_in|mid_block|(down|up)_blocks\.\d+)"


def activation_rules(recipe: Recipe, name: str, module, runtime: Runtime,
                     family: ModelFamily | None = None) -> list:
    """The activation rules of component ``name``: the recipe's where it gives any
    (an empty list too: none), else a transformer's tokens over the sequence axis
    (``sequence_split``) or its family's default (``default_activations``), else the
    default split of a VAE (``vae_split``) that
    decodes in one piece: a recipe that tiles its VAE (``setup: {vae:
    [enable_tiling]}``) or compiles it in pieces (``compile.vae.modules``) has chosen
    how it splits (HunyuanVideo's tiles, each decoded whole on every chip)."""
    if name in recipe.sharding.activations:
        return recipe.sharding.activations[name]
    if family is not None and name in family.stepped_transformers:
        return sequence_split(recipe, family, runtime.axes) \
            or family.default_activations(recipe, name, runtime.axes,
                                          getattr(module, "config", None))
    if decoded_in_pieces(recipe, name):
        return []
    return vae_split(name, module, runtime)


def decoded_in_pieces(recipe: Recipe, name: str) -> bool:
    """Does the recipe tile component ``name`` (``setup: {vae: [enable_tiling]}``) or
    compile it in pieces (``compile.vae.modules``)?"""
    rule = recipe.compile.get(name)
    tiled = "enable_tiling" in [getattr(call, "name", call)
                                for call in recipe.setup.get(name, [])]
    return tiled or (rule is not None and rule.modules is not None)


#: the mesh axes that split a transformer's tokens (sequence parallelism): over ``sp``
#: attention exchanges tokens for heads (Ulysses: an all-to-all; where the heads do not
#: divide it, the ring runs over it instead); over ``ring`` each device's keys and
#: values go round the axis (ring attention). Both: heads over sp, the ring over ring.
SEQUENCE_AXIS = "sp"
RING_AXIS = "ring"


def sequence_axis(axes: dict) -> str | None:
    """``SEQUENCE_AXIS`` where the mesh splits over it (``axes``: name -> size; a
    recipe's ``'auto'`` counts: the devices decide its size), else None."""
    return SEQUENCE_AXIS if axes.get(SEQUENCE_AXIS, 1) != 1 else None


def token_axes(axes: dict) -> tuple[str, ...]:
    """The axes the mesh splits the transformer's tokens over, in the order their
    shares are laid out (the ring's outermost): ``ring``, ``sp``, those it has."""
    return tuple(axis for axis in (RING_AXIS, SEQUENCE_AXIS) if axes.get(axis, 1) != 1)


def token_spec(axes: dict):
    """The tokens' entry of a rule's spec: one axis, both (a list), or None."""
    found = token_axes(axes)
    return found[0] if len(found) == 1 else (list(found) or None)


def head_axis(section, axes: dict) -> str | None:
    """The axis attention splits its heads over: the recipe's ``attention.head_axis``,
    or ``sp`` where the tokens are split over it (validate refuses another beside it)."""
    return section.head_axis or sequence_axis(axes)


def sequence_problems(recipe: Recipe, family: ModelFamily | None) -> list[Problem]:
    """A mesh that splits the tokens (``sp``, ``ring``): beside ``sp`` attention splits
    the heads over it (another head axis would gather the tokens on every device), and
    each transformer has its tokens' rule (the family's ``token_blocks``, or the
    recipe's own)."""
    axes = token_axes(recipe.mesh)
    if not axes:
        return []
    named = " and ".join(repr(axis) for axis in axes)
    found = []
    head = recipe.attention.head_axis
    if head == RING_AXIS and RING_AXIS in axes:
        found.append(recipe.problem(
            "attention.head_axis", f"the tokens go round {RING_AXIS!r}: its devices hold "
            "tokens, not heads", hint=f"leave attention.head_axis out, or name another "
            f"axis ({SEQUENCE_AXIS}, or tp beside {RING_AXIS})"))
    elif sequence_axis(recipe.mesh) and head not in (None, SEQUENCE_AXIS):
        found.append(recipe.problem(
            "attention.head_axis", f"the tokens are split over {SEQUENCE_AXIS!r}: attention "
            f"exchanges them for heads on that axis, not on {head!r}",
            hint=f"leave attention.head_axis out (or set it to {SEQUENCE_AXIS}), and split "
                 f"the weights over {head!r} if you keep that axis (or split the tokens "
                 f"over {RING_AXIS!r}, beside which the heads may go over {head!r})"))
    if family is not None and family.token_blocks is None:
        tokens = axes[0] if len(axes) == 1 else f"[{', '.join(axes)}]"
        for name in family.stepped_transformers:
            if name not in recipe.sharding.activations:
                found.append(recipe.problem(
                    f"mesh.{axes[0]}", f"family {family.name!r} does not say which "
                    f"of {name}'s modules output its tokens, to split over {named}",
                    hint=f"give sharding.activations.{name} a rule: the blocks whose "
                         f"output is (batch, tokens, width), spec [null, {tokens}, "
                         "null]"))
    return found


def token_problems(recipe: Recipe, tokens: int | None, axes: dict) -> list[Problem]:
    """The video's ``tokens`` (a family's estimate; None: not known) against the devices
    the mesh splits them over: a count they do not divide would leave attention
    gathering every key on every device instead of exchanging or passing them."""
    found = token_axes(axes)
    cut = math.prod(axes[axis] for axis in found)
    if not tokens or tokens % cut == 0:
        return []
    named = " x ".join(f"{axis}={axes[axis]}" for axis in found)
    return [recipe.problem(
        f"mesh.{found[0]}", f"the video's {tokens} tokens do not divide over {named} "
        f"({cut} devices)", hint="choose a size whose tokens divide (generate.height, "
        "width, frames), or fewer devices on the token axes")]


def sequence_split(recipe: Recipe, family: ModelFamily, axes: dict) -> list[ActivationRule]:
    """A transformer's tokens split over the mesh's token axes (``token_axes``) through
    every block: the outputs of the family's ``token_blocks`` (batch, tokens, width)
    with the tokens over them and the batch on attention's data axis
    (``AttentionSection.batch_axis``, as its kernel holds it), so norms, projections
    and the feed-forward layers run on each device's own tokens; attention exchanges
    tokens for heads, or passes keys round the ring, around its kernel
    (``attention.sharded.run``). None without a token axis, or for a family that does
    not say its token blocks (``validate`` asks such a recipe for its own rule)."""
    spec = token_spec(axes)
    if spec is None or family.token_blocks is None:
        return []
    return [ActivationRule(module=family.token_blocks,
                           spec=[recipe.attention.batch_axis(axes), spec, None])]


def vae_split(name: str, module, runtime: Runtime) -> list[ActivationRule]:
    """A VAE's encoder and decoder with their feature maps split over width across
    every device of an accelerator mesh: each device convolves its columns, XLA passing
    the halo each convolution needs between neighbours (and gathering a frame where a
    block attends over it), so each chip computes and holds about an eighth of an
    8-chip decode (halos and gathered frames on top). Not on CPU devices, which share
    the host's cores: Wan 1.3B's decode at 256x128 took 20.2 s split over 8 virtual
    devices against 17.9 s on one
    (benchmarks/README.md), so the VAE runs on one device there
    (``placement.on_one_device``). Nothing for a component that is not the video's VAE
    (``vae``, ``vae_2``: an ``audio_vae``'s maps are mel bins, not width) or whose
    decoder has no such blocks (a transformer decoder)."""
    axes = [axis for axis, size in runtime.axes.items() if size > 1]
    if not re.fullmatch(VIDEO_VAE, name) or not axes or runtime.platform == "cpu":
        return []
    if not any(re.fullmatch(VAE_BLOCKS, sub) and sub.startswith("decoder.")
               for sub, _ in module.named_modules()):
        return []
    return [ActivationRule(module=VAE_BLOCKS, spec=[LEADING, axes])]


def in_row_blocks(recipe: Recipe, name: str, module, runtime: Runtime,
                  activations: list) -> bool:
    """Does Wan's VAE (``vae``, ``vae_2``) run its decoder in row blocks
    (``porter.families.row_blocks``)? On a TPU, whose compiler convolves them at half
    the cost, where the ``activations`` rules applied to it keep each chip's rows whole:
    its maps split over width (the default split, ``vae_split``), or not at all. A rule
    that splits the rows (or the batch, the frames, the channels; an encoder's rules
    count too, which only ever keeps the plain form) is left to run as it says, and so
    is a VAE the recipe tiles or compiles in pieces (``decoded_in_pieces``: a piece
    compiled by itself runs its class's own forward, not the blocks'). Elsewhere than on
    a TPU nothing has measured the blocks (a GPU's convolutions are cuDNN's, not tiled
    so)."""
    if runtime.platform != "tpu" or not re.fullmatch(VIDEO_VAE, name) \
            or decoded_in_pieces(recipe, name) or not wan_vae.is_wan_vae(module):
        return False

    def split(entry) -> bool:
        named = entry if isinstance(entry, (list, tuple)) else [entry]
        return any(axis is not None and runtime.axes.get(axis, 1) != 1 for axis in named)

    return not any(split(entry) for rule in activations
                   for entry in (aligned(rule.spec, 5) or ())[:4])


def family_inputs(recipe: Recipe, name: str, axes: dict, family: ModelFamily,
                  config) -> dict:
    """Keyword input -> spec of the family's own placement of component ``name``'s
    inputs (``default_inputs``, given its ``config``) that the recipe's
    ``sharding.inputs`` leaves (a transformer's; other components take none)."""
    if not name.startswith("transformer"):
        return {}
    found = family.default_inputs(recipe, name, axes, config)
    return {k: spec for k, spec in found.items() if k not in recipe.sharding.inputs}


def input_specs(recipe: Recipe, name: str, axes: dict, family: ModelFamily,
                module) -> dict:
    """Keyword input -> spec for component ``name``'s calls (its compiled functions'
    too): the family's (``family_inputs``, given ``module``'s config) and the
    recipe's ``sharding.inputs``."""
    if not name.startswith("transformer"):
        return {}
    config = getattr(module, "config", None)
    return {**family_inputs(recipe, name, axes, family, config), **recipe.sharding.inputs}


class ShardedInputs:
    """Calls a module, and its ``methods`` (a family's compiled functions), with named
    keyword arguments placed on the mesh by spec."""

    def __init__(self, module, specs: dict, runtime: Runtime, methods=()):
        from jax.sharding import NamedSharding

        self.module = module
        self.runtime = runtime
        self.methods = frozenset(methods)
        self.shardings = {k: NamedSharding(runtime.mesh, partition_spec(s))
                          for k, s in specs.items()}

    def __call__(self, *args, **kwargs):
        return self.module(*args, **self._placed(kwargs))

    def _placed(self, kwargs: dict) -> dict:
        import jax
        from torchax.tensor import Tensor

        for key, sharding in self.shardings.items():
            value = kwargs.get(key)
            if isinstance(value, Tensor):
                kwargs[key] = Tensor(jax.device_put(value._elem, sharding), self.runtime.env)
        return kwargs

    def __getattr__(self, key):
        value = getattr(self.module, key)
        if key in self.methods and callable(value):
            return lambda *args, **kwargs: value(*args, **self._placed(kwargs))
        return value
