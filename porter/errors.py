"""User-facing errors.

Library code raises these; only the CLI turns them into exit codes and short
messages. Each carries enough to act on: what went wrong, where, and a hint.
"""

from __future__ import annotations

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


class UsageError(PorterError):
    """The user asked for something that cannot work as asked (bad input)."""

    exit_code = 2


class LoadError(UsageError):
    """A model source could not be found or read."""


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

    def __str__(self) -> str:
        return self.render()
