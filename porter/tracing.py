"""Turn JAX tracing failures inside model code into a message that says where and
what to do: the model needs a patch (or smaller compiled modules)."""

from __future__ import annotations

import contextlib
import traceback

from porter.errors import PorterError

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


def model_frame(exc: BaseException) -> str | None:
    """file:line (function) of the innermost frame in a model library."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        parts = frame.filename.replace("\\", "/").split("/")
        for library in LIBRARIES:
            if library in parts:
                relative = "/".join(parts[parts.index(library):])
                return f"{relative}:{frame.lineno} ({frame.name}): {(frame.line or '').strip()}"
    return None


def _failure_site(exc: BaseException) -> str | None:
    """Where a failure inside model code happened: the innermost model-library frame,
    provided no Porter frame is deeper (a Porter function the model called, such as
    an attention backend or a patch, failing is Porter's bug, not the model's)."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        parts = frame.filename.replace("\\", "/").split("/")
        if "porter" in parts or any(p.startswith("porter_") for p in parts):
            return None
        if any(library in parts for library in LIBRARIES):
            return model_frame(exc)
    return None


def _hint(exc: BaseException, where: str) -> str:
    """What to do about a failure in model code (at ``where``), by its kind."""
    text = str(exc)
    if where.split("): ", 1)[-1].startswith("raise "):  # the library's own check
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
    if isinstance(exc, NotImplementedError) or "not implemented" in text.lower():
        return ("torchax has no lowering for an operation this model uses: a patch can "
                "replace the function (docs/authoring-recipes.md, section 6)")
    return ("if the same pipeline runs in plain diffusers, this is a porting gap: rerun with "
            "--debug for the traceback, then patch the function "
            "(docs/authoring-recipes.md, section 6)")


@contextlib.contextmanager
def explained():
    """Failures inside model code as ``PortingError``: what kind, where (file:line in
    the model library) and what to do. Failures in Porter's own code pass through:
    they are bugs, reported as internal errors."""
    from porter.interrupt import Interrupted

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
        from porter.errors import is_environment_error, is_out_of_memory

        # the machine's refusals (disk full, out of memory) are reported as such
        where = None if is_environment_error(exc) or is_out_of_memory(exc) \
            else _failure_site(exc)
        if where is None:
            raise
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise PortingError(f"model code failed under Porter ({type(exc).__name__}"
                           + (f": {message[:300]}" if message else "") + f") at {where}",
                           hint=_hint(exc, where)) from exc
