"""Turn JAX tracing failures inside model code into a message that says where and
what to do: the model needs a patch (or smaller compiled modules)."""

from __future__ import annotations

import contextlib
import traceback
from typing import NamedTuple

from porter.errors import Interrupted, PorterError, is_environment_error, is_out_of_memory

LIBRARIES = ("diffusers", "transformers")


class PortingError(PorterError):
    """Model code does something a compiled (traced) program cannot."""

    exit_code = 2


def untraceable() -> tuple[type, ...]:
    """JAX's errors for Python that needs a concrete value inside a traced function."""
    import jax

    return tuple(getattr(jax.errors, name) for name in (
        "ConcretizationTypeError", "TracerArrayConversionError",
        "TracerIntegerConversionError", "NonConcreteBooleanIndexError")
        if hasattr(jax.errors, name))


def needs_values(exc: BaseException | None) -> bool:
    """Is ``exc``, or what it was raised from (``explained`` names the model's line
    around it), JAX's error for Python that needs a concrete value?"""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, untraceable()):
            return True
        seen.add(id(exc))
        exc = exc.__cause__
    return False


def model_frame(exc: BaseException) -> str | None:
    """file:line (function) of the innermost frame in a model library."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        parts = frame.filename.replace("\\", "/").split("/")
        for library in LIBRARIES:
            if library in parts:
                relative = "/".join(parts[parts.index(library):])
                return f"{relative}:{frame.lineno} ({frame.name}): {(frame.line or '').strip()}"
    return None


#: where torchax turns PyTorch into JAX: an error raised in these is torchax's, not
#: the model library's
ENGINES = ("torchax", "jax", "jaxlib")
#: Porter's code that carries the model's call into a compiled program: what torchax or
#: JAX raise beneath it is the model's (or torchax's) doing; what it raises itself is
#: Porter's
CONDUITS = ("porter/transforms/jit/autosplit.py", "porter/transforms/jit/__init__.py",
            "porter/transforms/jit/scan.py", "porter/transforms/jit/lifting.py",
            "porter/transforms/sharding.py")


def _kind(filename: str) -> str:
    path = filename.replace("\\", "/")
    parts = path.split("/")
    if any(path.endswith(conduit) for conduit in CONDUITS):
        return "conduit"
    if "porter" in parts or any(p.startswith("porter_") for p in parts):
        return "porter"
    if any(library in parts for library in LIBRARIES):
        return "library"
    if any(engine in parts for engine in ENGINES):
        return "engine"
    return "other"  # PyTorch, the standard library: they run the same in plain PyTorch


class Site(NamedTuple):
    where: str  # file:line (function): code, in the model library
    in_torchax: bool  # raised by torchax or JAX beneath that line


def _failure_site(exc: BaseException) -> Site | None:
    """Where a failure inside model code happened: the innermost model-library frame,
    with torchax and JAX beneath it, and Porter's conduits into compiled programs
    when torchax or JAX raised beneath them, passed over. None when Porter's own code
    raised it or made the failing call: a Porter function the model called (an
    attention backend, a patch) failing is Porter's bug."""
    in_torchax = False
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        kind = _kind(frame.filename)
        if kind == "porter" or (kind == "conduit" and not in_torchax):
            return None
        if kind == "engine":
            in_torchax = True
        elif kind == "library":
            relative = frame.filename.replace("\\", "/").split("/")
            for library in LIBRARIES:
                if library in relative:
                    relative = "/".join(relative[relative.index(library):])
                    break
            return Site(f"{relative}:{frame.lineno} ({frame.name}): "
                        f"{(frame.line or '').strip()}", in_torchax)
    return None


def _hint(exc: BaseException, site: Site) -> str:
    """What to do about a failure in model code, by its kind."""
    text, where = str(exc), site.where
    if not site.in_torchax and where.split("): ", 1)[-1].startswith("raise "):
        return ("the model library refused the call: check the recipe's generate settings "
                "(and generate.extra) against what the message asks for")
    if isinstance(exc, (AssertionError, AttributeError)) and (
            "mixed math" in text or "_env" in text):
        return ("a host (CPU) tensor met a JAX tensor: the model builds a tensor on the CPU "
                "inside this function (torch.tensor, torch.arange without device=...). "
                "Write a patch that builds it on the device or before the call "
                "(docs/authoring-recipes.md, section 6)")
    if isinstance(exc, TypeError) and "argument" in text:
        return ("the function was called with arguments it does not take: check "
                "generate.extra and the recipe's settings against the pipeline's signature "
                "(`porter validate` checks them)")
    if isinstance(exc, (ValueError, RuntimeError, TypeError)) and any(
            word in text for word in ("shape", "broadcast", "size", "dimension")):
        return ("shapes the model did not expect: check generate.height, width and frames "
                "against what the model takes (multiples of its VAE and patch sizes)")
    if isinstance(exc, NotImplementedError) or "not implemented" in text.lower() \
            or "has no lowering" in text:
        return ("torchax has no lowering for an operation this model uses: a patch can "
                "replace the function (docs/authoring-recipes.md, section 6)")
    if site.in_torchax:  # PyTorch runs this line; torchax could not
        return ("torchax could not run this line as PyTorch does: a porting gap. Rerun "
                "with --debug for the traceback, then patch the function "
                "(docs/authoring-recipes.md, section 6)")
    return ("the library's own code raised this, not torchax: the same call is likely to "
            "fail in plain diffusers too. Check the recipe's generate settings (and "
            "generate.extra) against the pipeline's arguments and defaults")


@contextlib.contextmanager
def explained():
    """Failures inside model code as ``PortingError``: what kind, where (file:line in
    the model library) and what to do. Failures in Porter's own code pass through:
    they are bugs, reported as internal errors."""

    try:
        yield
    except (PorterError, Interrupted):  # a signal may land anywhere, model code too
        raise
    except untraceable() as exc:
        where = model_frame(exc)
        what = type(exc).__name__
        raise PortingError(
            f"model code needs a concrete value inside a compiled function ({what})"
            + (f" at {where}" if where else ""),
            hint="a branch on a tensor's value, .item() or boolean indexing cannot be "
                 "traced: write a patch for that function (docs/authoring-recipes.md, "
                 "section 6), or compile smaller modules (compile.<component>.modules) so "
                 "the code around them runs eagerly") from exc
    except Exception as exc:

        # the machine's refusals (disk full, out of memory) are reported as such
        site = None if is_environment_error(exc) or is_out_of_memory(exc) \
            else _failure_site(exc)
        if site is None:
            raise
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise PortingError(f"model code failed under Porter ({type(exc).__name__}"
                           + (f": {message[:300]}" if message else "")
                           + f") at {site.where}", hint=_hint(exc, site)) from exc
