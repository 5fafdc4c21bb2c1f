"""Recipes: YAML files loaded into a validated, immutable ``Recipe``.

Loading order: the file (and what it ``extends``, deep-merged, base first),
then command-line overrides, then the schema. Every problem is collected and
raised together as one ``RecipeError`` with file:line and key path.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import reprlib
import types
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, PrivateAttr, ValidationError

from porter.errors import Problem, RecipeError, UsageError
from porter.recipe.schema import RecipeSpec
from porter.recipe.yamlio import KeyPath, Location, Refused, load_mapping, parse_value

#: where a problem an override made is said to be: the command line's KEY=VALUE
#: arguments, ``porter.load``'s overrides and a served job's settings alike
OVERRIDE_FILE = "overrides"
# A base of a base of ...: real recipes use one or two levels.
MAX_EXTENDS = 16


class Recipe(RecipeSpec):
    """A validated recipe plus where each of its keys came from."""

    _path: Path | None = PrivateAttr(None)
    _locations: dict = PrivateAttr(default_factory=dict)

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def name(self) -> str:
        return self._path.stem if self._path else "recipe"

    def resolved(self) -> dict:
        """The recipe as plain data, every default filled in."""
        return self.model_dump(mode="json")

    def digest(self) -> str:
        text = json.dumps(self.resolved(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def file_path(self, dotted: str, value: str) -> Path:
        """A path the recipe names: relative to the recipe file that set it, or to the
        current directory when it came from the command line."""
        try:
            path = Path(value).expanduser()
        except RuntimeError:  # '~name/...' for a user this machine does not have
            raise UsageError(f"{dotted}: cannot expand {_describe(value)}: no such user",
                             hint="write the path out in full") from None
        return path if path.is_absolute() else self._base_folder(dotted) / path

    def relative_paths(self, dotted: str) -> str:
        """Where a relative path at ``dotted`` is read from (``file_path``), for a hint."""
        return f"a relative path is read from {self._base_folder(dotted).resolve()}"

    def _base_folder(self, dotted: str) -> Path:
        """The folder of the recipe file that set ``dotted``; the current one (``.``)
        for a value from the command line, a request or Python."""
        file, _ = _lookup(self._locations, _split(dotted), self._path)
        return Path() if file in (None, OVERRIDE_FILE) else Path(file).parent

    def sets(self, dotted: str) -> bool:
        """Does the recipe (a file it extends, or an override) set this key itself,
        rather than leave it to its default?"""
        return _split(dotted) in self._locations

    def problem(self, path: str, message: str, hint: str | None = None) -> Problem:
        """A Problem located at ``path`` (dotted), or its nearest located parent."""
        file, line = _lookup(self._locations, _split(path), self._path)
        return Problem(path, message, file=file, line=line, hint=hint)


def _split(dotted: str) -> KeyPath:
    return tuple(int(p) if p.isdigit() else p for p in dotted.split(".")) if dotted else ()


def _lookup(locations: dict[KeyPath, Location], path: KeyPath, default: Path | None):
    """Where ``path`` was set: its own place, or its nearest parent's; a section no
    file holds is where the keys inside it were set (the file's line 1, the root's
    place, would point at a file without the section)."""
    for end in range(len(path), 0, -1):
        if path[:end] in locations:
            file, line = locations[path[:end]]
            named = _overrides_inside(locations, path) if file != OVERRIDE_FILE else None
            if named is None:
                return file, line
            # a section of the file with keys the command line changed (mesh: in the
            # file, mesh.dp=3 given): both are what the problem is about
            return f"{named} over {file}" + (f":{line}" if line else ""), None
    for end in range(len(path), 0, -1):
        if inside := _inside(locations, path[:end]):
            return inside
    return locations.get((), (str(default) if default else None, None))


def _inside(locations: dict[KeyPath, Location], path: KeyPath) -> Location | None:
    """Where the keys inside section ``path`` were set: the overrides that set them,
    named (``overrides (quantize.include)``), else the first one's place."""
    inside = [key for key in locations if len(key) > len(path) and key[:len(path)] == path]
    if not path or not inside:
        return None
    named = _overrides_inside(locations, path)
    return (named, None) if named else locations[inside[0]]


def _overrides_inside(locations: dict[KeyPath, Location], path: KeyPath) -> str | None:
    """``overrides (quantize.include, ...)``: the overrides that set keys inside section
    ``path``, named; None if none did."""
    overrides = [".".join(map(str, key)) for key in locations
                 if len(key) > len(path) and key[:len(path)] == path
                 and locations[key][0] == OVERRIDE_FILE]
    if not overrides:
        return None
    more = f" and {len(overrides) - 3} more" if len(overrides) > 3 else ""
    return f"{OVERRIDE_FILE} ({', '.join(overrides[:3])}{more})"


# ---------------------------------------------------------------- extends


def _deep_merge(base: dict, child: dict) -> dict:
    merged = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value  # scalars and lists replace
    return merged


def exists(path: Path) -> bool:
    """Path.exists that answers False, not an exception, for a path the system refuses
    (too long, no permission, a NUL in it): reading it then says why."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _resolve(path: Path) -> Path:
    """The absolute path with symlinks followed; as given when it cannot be (a loop)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError, ValueError):  # RuntimeError: a symlink loop (3.11)
        return path.absolute()


def _load_with_extends(path: Path, chain: tuple[Path, ...]) -> tuple[dict, dict]:
    path = _resolve(path) if exists(path) else path
    data, locations = load_mapping(path)
    base_ref = data.pop("extends", None)
    if base_ref is None:
        return data, locations
    # _lookup, not locations[...]: an extends that came through a YAML merge key
    # (<<) has no line of its own.
    where = _lookup(locations, ("extends",), path)
    if not isinstance(base_ref, str):
        raise RecipeError([Problem("extends", "expected a file name (string)", *where,
                                   hint="extends: wan-base.yaml")])
    base_path = _resolve(path.parent / base_ref)
    if base_path in chain + (path,):
        cycle = " -> ".join(p.name for p in chain + (path, base_path))
        raise RecipeError([Problem("extends", f"extends cycle: {cycle}", *where,
                                   hint="remove one of the extends")])
    if len(chain) + 1 >= MAX_EXTENDS:
        raise RecipeError([Problem("extends", f"more than {MAX_EXTENDS} recipes extend "
                                   "one another", *where, hint="flatten the chain")])
    if not exists(base_path):
        raise RecipeError([Problem("extends", f"base recipe {_describe(base_ref)} not found "
                                   f"(looked in {path.parent})", *where,
                                   hint="extends is relative to the recipe's own folder")])
    if not base_path.is_file():  # a folder, or a device or FIFO that would never end
        kind = "a directory" if base_path.is_dir() else "not a regular file"
        raise RecipeError([Problem("extends", f"base recipe {_describe(base_ref)} is {kind}",
                                   *where, hint="extends names a recipe .yaml file")])
    base_data, base_locations = _load_with_extends(base_path, chain + (path,))
    merged, merged_locations = _deep_merge(base_data, data), {**base_locations, **locations}
    _schedule_counts_steps(merged, merged_locations, data.get("generate"))
    return merged, merged_locations


#: generate settings that give the schedule step by step
SCHEDULE_KEYS = ("timesteps", "sigmas")


def _schedule_counts_steps(data: dict, locations: dict, layer) -> None:
    """A layer (a recipe over the one it extends, the overrides, a call's settings)
    that gives a schedule step by step and no step count: the schedule counts the
    steps, whatever a layer below said (the schema fills ``steps`` in)."""
    generate = data.get("generate")
    if isinstance(layer, dict) and isinstance(generate, dict) and "steps" not in layer \
            and any(layer.get(key) is not None for key in SCHEDULE_KEYS):
        generate.pop("steps", None)
        locations.pop(("generate", "steps"), None)


# ---------------------------------------------------------------- overrides


def parse_override(text: str) -> tuple[KeyPath, Any]:
    """``generate.steps=4`` -> (("generate", "steps"), 4); the value is YAML, except
    for a key that holds text (``_takes_text``)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip() or any(not part for part in key.strip().split(".")):
        raise RecipeError([Problem(key, f"override {text!r} is not KEY.PATH=VALUE",
                                   file=OVERRIDE_FILE, hint="e.g. generate.steps=4")])
    path = tuple(key.strip().split("."))
    if _takes_text(path) and not raw.strip().startswith(("'", '"')) \
            and raw.strip() not in NULLS:
        # a prompt as typed: read as YAML, "a fox: running" would be a mapping, "no" a
        # boolean, and "a fox #1" would lose its tail to a comment without a word
        return path, raw.strip()
    try:
        value = parse_value(raw) if raw.strip() else ""
    except Refused as exc:  # well-formed, but what no recipe may hold (a tag, a bomb)
        raise RecipeError([Problem(key, f"override {exc.problem}", file=OVERRIDE_FILE,
                                   hint=exc.hint)]) from None
    except yaml.YAMLError as exc:
        if _bracketed(raw):  # meant as a whole list or mapping: say why it is not one
            raise RecipeError([_not_yaml(key, exc)]) from None
        value = raw  # a string with YAML punctuation in it ("[cinematic] a cat")
    glued = [k for k, v in value.items() if isinstance(k, str) and ":" in k and v is None] \
        if isinstance(value, dict) else []
    if glued:  # {dp:2} is YAML for a key "dp:2" with no value
        raise RecipeError([Problem(key, f"override value {raw.strip()!r} reads {glued[0]!r} "
                                   "as one key with no value", file=OVERRIDE_FILE,
                                   hint="YAML needs a space after each colon: "
                                   + glued[0].replace(":", ": ", 1))])
    return path, value


#: the two spellings of ``X | Y`` an annotation may have
UNIONS = (Union, types.UnionType)
#: what an override writes to unset an optional key ("generate.prompt=null")
NULLS = frozenset({"null", "Null", "NULL", "~"})


def _takes_text(path: KeyPath) -> bool:
    """Whether the recipe key at ``path`` holds text and nothing else (``str``, or
    ``str | None``): a prompt, a folder. Its override value is the text as typed
    (quoted, it is read as YAML: escapes, surrounding spaces)."""
    owner = _model_at(RecipeSpec, path[:-1])
    field = owner.model_fields.get(path[-1]) if owner is not None else None
    if field is None:
        return False
    annotation = field.annotation
    kinds = get_args(annotation) if get_origin(annotation) in UNIONS else (annotation,)
    # a path is text with checks (Annotated[str, ...]): its member of the union unwrapped
    kinds = {get_args(k)[0] if get_origin(k) is Annotated else k for k in kinds}
    return str in kinds and kinds <= {str, type(None)}


def _bracketed(raw: str) -> bool:
    """Whether a value is written as a whole list or mapping: ``[...]`` or ``{...}``."""
    text = raw.strip()
    return len(text) > 1 and text[0] + text[-1] in ("[]", "{}")


def _not_yaml(key: str, exc: yaml.YAMLError) -> Problem:
    """Why a bracketed override value is not YAML, with the quoting that mends it."""
    reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if "escape" in reason:
        hint = ("quote regexes with single quotes inside the value (in YAML's double "
                "quotes a backslash starts an escape: write \\\\. for \\.)")
    else:
        hint = ("write it in YAML's flow style ([a, b], {key: value}), or for a string "
                f"""quote the whole value: {key.strip()}='"..."'""")
    return Problem(key, f"override value is not YAML: {reason}", file=OVERRIDE_FILE,
                   hint=hint)


def _apply_override(data: dict, locations: dict, path: KeyPath, value: Any) -> None:
    node = data
    for depth, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(path[: depth + 1])
            raise RecipeError([Problem(".".join(path), f"{where} is not a section, cannot set "
                                       "a key inside it", file=OVERRIDE_FILE)])
        node = child
    node[path[-1]] = value
    locations[path] = (OVERRIDE_FILE, None)


# ---------------------------------------------------------------- validation


def _model_at(model: type[BaseModel], loc: KeyPath) -> type[BaseModel] | None:
    """The schema class that owns the keys at ``loc`` (None if not a section)."""
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return None
        candidates = [field.annotation, *get_args(field.annotation)]
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not nested:
            return None
        model = nested[0]
    return model


def _sections_with(model: type[BaseModel], key: str, prefix: str = "",
                   depth: int = 3) -> list[str]:
    """The dotted keys named ``key`` in ``model`` and its sections (``depth`` levels in
    all), ``model``'s own first: a key written at the wrong level (``height=`` for
    ``generate.height=``, ``generate.model=`` for ``model=``) is found where it
    belongs."""
    found = [f"{prefix}{key}"] if key in model.model_fields and depth else []
    for name in model.model_fields if depth > 1 else ():
        section = _section_of(model.model_fields[name].annotation)
        if section is None:
            continue
        found += _sections_with(section, key, f"{prefix}{name}.", depth - 1)
    return found[:3]


def keys_named(key: str) -> list[str]:
    """The recipe keys that hold a value and whose last part is ``key`` (``steps`` ->
    ``generate.steps``; not a section such as ``model``), at most three: what a flag
    the user wrote as ``--steps`` was meant to set."""
    return [dotted for dotted in _sections_with(RecipeSpec, key) if _holds_a_value(dotted)]


def _holds_a_value(dotted: str) -> bool:
    """Whether the key at ``dotted`` takes a value (not a section, nor a list or
    mapping of them)."""
    *owner, name = dotted.split(".")
    annotation = _model_at(RecipeSpec, tuple(owner)).model_fields[name].annotation
    inner = [annotation, *get_args(annotation)]
    inner += [member for arg in get_args(annotation) for member in get_args(arg)]
    if any(get_origin(m) is dict or m is dict for m in inner):  # a mapping (mesh)
        return False
    return not any(isinstance(m, type) and issubclass(m, BaseModel) for m in inner)


def _section_of(annotation: Any) -> type[BaseModel] | None:
    """The schema class of a field that is one section (``Generate``, or an optional
    one); None for a value, or for a list or mapping of sections (``lora``, ``compile``),
    whose keys sit one level further down (``lora[0].scale``)."""
    if get_origin(annotation) not in (None, Union, types.UnionType):
        return None
    members = get_args(annotation) or (annotation,)
    nested = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
    return nested[0] if nested else None


def _data_path(data: Any, loc: tuple, missing: bool) -> KeyPath:
    """The part of a pydantic location that names keys in ``data``.

    Pydantic appends union-member tags (e.g. 'int', "literal['auto']") after
    the key of a union-typed value; those are not keys and are dropped. A
    missing key is, by definition, absent from the data, and is kept.
    """
    path: list = []
    for index, part in enumerate(loc):
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            if missing and index == len(loc) - 1 and isinstance(data, dict):
                path.append(part)
            break
        path.append(part)
    return tuple(path)


class _Glance(reprlib.Repr):
    """repr() for messages: a huge list, string or nested value costs a glance, and an
    integer too long for str() (Python's 4300-digit limit) is described, not printed."""

    def repr_int(self, value: int, level: int) -> str:
        if value.bit_length() > 200:
            return f"<{value.bit_length()}-bit integer>"
        return super().repr_int(value, level)


_GLANCE = _Glance()
_GLANCE.maxstring = _GLANCE.maxother = 60


def _describe(value: Any) -> str:
    text = _GLANCE.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unknown_key_hint(key: str, section: KeyPath, valid: list[str]) -> str | None:
    """What an unknown ``key`` inside ``section`` was meant as: a dotted path written
    as one key ({"generate.steps": 2} in a job's settings), a key of another section,
    a top-level section written inside one, a misspelling, else the keys there are."""
    inside = ".".join(map(str, section))
    last = key.rsplit(".", 1)[-1]
    if "." in key and last in valid:
        return f"inside {inside} write {last!r} alone, not the dotted path"
    moved = [m for m in _sections_with(RecipeSpec, key) if m != inside]
    if moved == [key] and section:  # 'output' inside generate: a section of its own
        return f"{key!r} is a section of the recipe, not a key of {inside}"
    close = difflib.get_close_matches(key, valid, n=1)
    return (f"did you mean {' or '.join(repr(m) for m in moved)}?" if moved
            else f"did you mean {close[0]!r}?" if close
            else f"valid keys here: {', '.join(valid)}" if valid else None)


def _problems_from(exc: ValidationError, data: dict, locations: dict,
                   default: Path | None) -> list[Problem]:
    merged: dict[KeyPath, Problem] = {}
    specific: set[KeyPath] = set()  # paths whose value matched a type and failed a check
    for err in exc.errors():
        path = _data_path(data, tuple(err["loc"]), err["type"] == "missing")
        dotted = ".".join(str(p) for p in path)
        file, line = _lookup(locations, path, default)
        kind = err["type"]
        if kind == "extra_forbidden":
            owner = _model_at(RecipeSpec, path[:-1])
            valid = sorted(owner.model_fields) if owner else []
            hint = _unknown_key_hint(str(path[-1]), path[:-1], valid)
            problem = Problem(dotted, f"unknown key {path[-1]!r}", file, line, hint)
        elif kind == "missing":
            owner = _model_at(RecipeSpec, path[:-1])
            field = owner.model_fields.get(str(path[-1])) if owner else None
            hint = field.description if field and field.description else None
            problem = Problem(dotted, "missing required key", file, line,
                              f"add '{path[-1]}:'" + (f" ({hint})" if hint else ""))
        else:
            expected = _expected(err)
            if kind == "value_error":  # says more than the union's other members' types
                specific.add(path)
            elif path in specific:
                continue
            elif path in merged:  # another member of the same union
                expected = (merged[path].message.split(" (got ")[0] + " or "
                            + expected.removeprefix("expected "))
            got = "" if kind == "value_error" else f" (got {_describe(err['input'])})"
            problem = Problem(dotted, expected + got, file, line)
        merged[path] = problem
    return list(merged.values())


def _expected(err: dict) -> str:
    if err["type"] in ("model_type", "dict_type"):
        return "expected a section of 'key: value' pairs"
    text = err["msg"]
    if text.startswith("Value error, "):
        return text[len("Value error, "):]
    for prefix in ("Input should be ", "Value should be "):
        if text.startswith(prefix):
            return "expected " + text[len(prefix):]
    return "expected " + text[0].lower() + text[1:]


def _mesh_problems(data: dict, locations: dict, default: Path | None) -> list[Problem]:
    mesh = data.get("mesh")
    if not isinstance(mesh, dict):
        return []
    problems = []
    for axis, size in mesh.items():
        if not (isinstance(axis, str) and axis.isidentifier()):
            file, line = _lookup(locations, ("mesh", axis), default)
            problems.append(Problem(f"mesh.{axis}", "mesh axis names must be identifiers",
                                    file, line, hint="e.g. dp, tp, sp"))
        if isinstance(size, int) and not isinstance(size, bool) and size < 1:
            file, line = _lookup(locations, ("mesh", axis), default)
            problems.append(Problem(f"mesh.{axis}", f"axis size must be >= 1 (got {size})",
                                    file, line))
    if sum(1 for s in mesh.values() if s == "auto") > 1:
        file, line = _lookup(locations, ("mesh",), default)
        problems.append(Problem("mesh", "at most one axis may be 'auto'", file, line))
    return problems


def _order(problem: Problem) -> tuple:
    return (problem.file or "", problem.line or 0, problem.path)


def validate_data(data: dict, locations: dict, path: Path | None = None) -> Recipe:
    problems = _mesh_problems(data, locations, path)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        problems = _problems_from(exc, data, locations, path) + problems
        raise RecipeError(sorted(problems, key=_order)) from None
    if problems:
        raise RecipeError(problems)
    recipe._path = path
    recipe._locations = locations
    return recipe


def with_values(recipe: Recipe, section: str, values: dict, source: str,
                line: int | None = None) -> Recipe:
    """``recipe`` with keys of one section set (``Port.generate``'s settings, a batch
    line, a server request), validated by the same schema; problems name ``source``
    (and ``line``) as where the values came from."""
    data = recipe.resolved()
    locations = dict(recipe._locations)
    for key, value in values.items():
        data.setdefault(section, {})[key] = value
        locations[(section, key)] = (source, line)
    if section == "generate":
        _schedule_counts_steps(data, locations, values)
    return validate_data(data, locations, recipe.path)


def load(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Load, merge, override and validate a recipe file."""
    path = Path(path)
    data, locations = _load_with_extends(path, ())
    problems, overridden = [], {}
    for text in overrides:
        try:
            key, value = parse_override(text)
            _apply_override(data, locations, key, value)
            if key[:1] == ("generate",) and len(key) == 2:
                overridden[key[1]] = value
        except RecipeError as exc:
            problems += exc.problems
    if problems:
        raise RecipeError(problems)
    _schedule_counts_steps(data, locations, overridden)
    return validate_data(data, locations, _resolve(path) if exists(path) else path)


