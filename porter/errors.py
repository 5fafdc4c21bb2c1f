"""User-facing errors.

Library code raises these; only the CLI turns them into exit codes and short
messages. Each carries enough to act on: what went wrong, where, and a hint.
"""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass


class PorterError(Exception):
    """Base of every error Porter reports to a user without a traceback."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def render(self) -> str:
        text = f"error: {self.message}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text

    def one_line(self) -> str:
        """The error in one line, for an API's answer (``render`` is the terminal's)."""
        return self.message + (f" (hint: {self.hint})" if self.hint else "")


def first_line(exc: BaseException) -> str:
    """An exception's first message line (its type's name when it has no message)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def kind_of(value) -> str:
    """A value's kind, in words, for messages ("a string where an integer belongs")."""
    for kind, words in ((bool, "a bool"), (int, "an integer"), (float, "a number"),
                        (str, "a string"), ((list, tuple), "a list"), (dict, "a mapping")):
        if isinstance(value, kind):  # numpy's float64 too: a float
            return words
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # torch, JAX, numpy
        return "a tensor"
    return f"a {type(value).__name__}"


class UsageError(PorterError):
    """The user asked for something that cannot work as asked (bad input)."""

    exit_code = 2


class LoadError(UsageError):
    """A model source could not be found or read."""


class NonFinite(UsageError):
    """The latents went NaN or infinite at a denoising step, or finite but larger than
    real latents ever are (``magnitude``, their largest |value|: ``finite.BOUND``)."""

    def __init__(self, step: int, total: int | None, saved_at: int | None,
                 staged: bool = True, magnitude: float = math.nan):
        kept = (f"; kept: the encode stage and the checkpoint after step {saved_at}"
                if saved_at else "; kept: the encode stage" if staged else "")
        of = f" of {total}" if total else ""  # a generic run may not know its count
        self.step, self.magnitude = step, magnitude
        if math.isfinite(magnitude):  # finite, so no overflow yet: the model is off
            super().__init__(
                f"denoising step {step}{of} made latents of magnitude {magnitude:.3g} (their "
                f"largest |value|; real latents are of order 1 to 10): stopped{kept}",
                hint="the model's output is orders of magnitude off: weights read as the "
                     "wrong format (a scaled fp8 file whose scale_weight tensors are gone "
                     "reads as a plain fp8 cast), or a model.transformer of another model "
                     "or size; compare with `porter verify`")
            return
        super().__init__(
            f"denoising step {step}{of} made NaN or infinite latents: stopped{kept}",
            hint="with finite weights this is numerical overflow: try model.dtype float32, "
                 "or keep the overflowing modules in float32 (dtypes), and compare with "
                 "`porter verify`")


class Interrupted(Exception):
    """The run was stopped by a signal (not a PorterError: the CLI exits 128 +
    the signal's number); ``saved`` says what was kept, if anything."""

    def __init__(self, signum: int, saved: str | None = None):
        self.signum = signum
        self.saved = saved
        super().__init__(signal.Signals(signum).name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a recipe: where it is, what was expected, a hint."""

    path: str  # dotted key path, e.g. "generate.steps"
    message: str
    file: str | None = None
    line: int | None = None
    hint: str | None = None

    def where(self) -> str:
        if self.file is None:
            return "<recipe>"
        return f"{self.file}:{self.line}" if self.line else self.file

    def render(self) -> str:
        key = f" {self.path}:" if self.path else ""
        text = f"{self.where()}:{key} {self.message}"
        if self.hint:
            text += f"\n    hint: {self.hint}"
        return text

    def one_line(self) -> str:
        """The problem in one line, for an API's answer: its key, what, and the hint."""
        return (f"{self.path}: " if self.path else "") + self.message + (
            f" (hint: {self.hint})" if self.hint else "")


class RecipeError(UsageError):
    """Every problem found in a recipe, reported at once."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        count = len(self.problems)
        noun = "problem" if count == 1 else "problems"
        super().__init__(f"recipe has {count} {noun}")

    def render(self) -> str:
        lines = [f"error: {self.message}"]
        lines += ["  " + p.render() for p in self.problems]
        return "\n".join(lines)

    def one_line(self) -> str:
        return "; ".join(p.one_line() for p in self.problems)

    def __str__(self) -> str:
        return self.render()


class EnvironmentProblem(UsageError):
    """The machine refused something (disk full, permission denied, a file where a
    directory belongs): not bad input, not a Porter bug, and fixed the same way as bad
    input, by the user."""


class OutOfMemory(EnvironmentProblem):
    """The run asked the devices or the host for more memory than they have: fixed by
    asking for less (the message says what it needs and the hint what to change)."""


# what an allocation that failed says: JAX on an accelerator or at compile
# (RESOURCE_EXHAUSTED), XLA's CPU client ("Out of memory allocating N bytes", under
# INTERNAL when a dispatched computation fails), torch's CPU allocator, CUDA
_OUT_OF_MEMORY = ("resource_exhausted", "out of memory", "can't allocate memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """An allocation the machine refused: ``MemoryError``, or a runtime error saying so
    (``jax.errors.JaxRuntimeError``, jaxlib's XlaRuntimeError, is a RuntimeError), in
    ``exc`` or what it was raised from."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and any(
                words in str(exc).lower() for words in _OUT_OF_MEMORY)):
            return True
        exc = exc.__cause__
    return False


class WriteFailed(OSError):
    """The machine refused a write, naming the file being written: ``write()`` on a
    full disk raises an OSError naming none. Still an OSError, so code that goes on
    without a cache catches it as before."""


_ERRNO_HINTS = {
    "ENOSPC": "the disk is full: free space there, or point the path at another disk "
              "(output.dir=... for a run's files)",
    "EDQUOT": "the disk quota is used up: free space there, or point the path elsewhere",
    "EFBIG": "the file is larger than this system allows (a file size limit)",
    "EACCES": "permission denied: choose a path you can write, or fix its permissions",
    "EPERM": "not permitted: choose a path you can write, or fix its permissions",
    "EROFS": "that filesystem is read-only: choose a path on a writable one",
    "ENOTDIR": "a file stands where a directory is needed: move it, or choose another path",
    "EEXIST": "a file stands where a directory is needed: move it, or choose another path",
    "EISDIR": "a directory stands where a file is needed: move it, or choose another path",
    "EMFILE": "too many open files: raise the limit (ulimit -n)",
    "EIO": "the device reported an input/output error: check the disk",
}


def is_environment_error(exc: BaseException) -> bool:
    """An OSError the machine gave (full, read-only, no permission, wrong kind of path)."""
    import errno

    return isinstance(exc, OSError) and exc.errno is not None and \
        errno.errorcode.get(exc.errno) in _ERRNO_HINTS


def environment_problem(exc: OSError, doing: str | None = None,
                        path=None) -> EnvironmentProblem:
    """The OSError as what failed, where (its file, else ``path``), and what to do."""
    import errno
    import os

    reason = exc.strerror or os.strerror(exc.errno or 0) or str(exc)
    where = exc.filename if exc.filename is not None else path
    what = f"{doing}: " if doing else ""
    if where is None:
        text = f"{what}{reason}"
    elif isinstance(exc, WriteFailed):
        text = f"{what}{reason} writing {where}"
    else:
        text = f"{what}{reason}: {where}"
    code = errno.errorcode.get(exc.errno or 0, "")
    return EnvironmentProblem(text, hint=_ERRNO_HINTS.get(code))


def failure(exc: Exception) -> PorterError:
    """What one failed batch item or server job reports, the rest going on: a
    PorterError as it is; the machine's refusal (a full disk) as what failed and where;
    anything else as a Porter bug."""
    if isinstance(exc, PorterError):
        return exc
    if is_environment_error(exc):
        return environment_problem(exc)
    return PorterError(f"internal error: {type(exc).__name__}: {exc} (a Porter bug: "
                       "report it)")
