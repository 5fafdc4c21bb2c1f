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


def _model_frame(exc: BaseException) -> str | None:
    """file:line (function) of the innermost frame in a model library."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        parts = frame.filename.replace("\\", "/").split("/")
        for library in LIBRARIES:
            if library in parts:
                relative = "/".join(parts[parts.index(library):])
                return f"{relative}:{frame.lineno} ({frame.name}): {(frame.line or '').strip()}"
    return None


@contextlib.contextmanager
def explained():
    import jax

    kinds = tuple(getattr(jax.errors, name) for name in (
        "ConcretizationTypeError", "TracerArrayConversionError",
        "TracerIntegerConversionError", "NonConcreteBooleanIndexError")
        if hasattr(jax.errors, name))
    try:
        yield
    except kinds as exc:
        where = _model_frame(exc)
        what = type(exc).__name__
        raise PortingError(
            f"model code needs a concrete value inside a compiled function ({what})"
            + (f" at {where}" if where else ""),
            hint="a branch on a tensor's value, .item() or boolean indexing cannot be "
                 "traced: write a patch for that function (docs/authoring-recipes.md, "
                 "section 6), or compile smaller modules (compile.<component>.modules) so "
                 "the code around them runs eagerly") from exc
