"""The ``cache:`` section: one step-caching method and its parameters.

The parameters and their defaults are diffusers' own (``MagCacheConfig``,
``FirstBlockCacheConfig``, ``TaylorSeerCacheConfig``), so a recipe means what
the same numbers mean to diffusers; ``tests/stepcache/test_stepcache.py`` keeps the defaults
equal. What Porter sets itself is left out: the step count (from the run). The
guidance cache is Porter's own.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationError, field_validator

from porter.recipe.schema import Dtype, PathText, Section


class MagCache(Section):
    """MagCache (arXiv 2506.09045): skip a step while the accumulated change of the
    residual's magnitude, predicted from calibrated ratios, stays small."""
    method: Literal["magcache"]
    threshold: float = Field(0.06, ge=0, description="largest accumulated error "
                             "sum |1 - ratio product| a run of skipped steps may reach")
    max_skip_steps: int = Field(3, ge=0, description="most steps skipped in a row")
    retention_ratio: float = Field(0.2, ge=0, le=1, description="the first fraction of "
                                   "steps always computed")
    mag_ratios: PathText | list[float] | None = Field(
        None, description="the model's magnitude ratios: a file `porter calibrate` wrote "
        "(relative to the recipe), or one list for a one-transformer model")
    calibrate: bool = Field(False, description="skip nothing; record the ratios "
                            "(`porter calibrate` sets it and writes them to a file)")

    @field_validator("mag_ratios", mode="before")
    @classmethod
    def _file_or_numbers(cls, value):
        numbers = isinstance(value, list) and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)
        if value is None or isinstance(value, str) or numbers:
            return [float(x) for x in value] if numbers else value
        raise ValueError("expected a file `porter calibrate` wrote, or a list of numbers")


class FirstBlockCache(Section):
    """First-block cache: run the first block; skip the rest while its residual
    barely changed since the last computed step."""
    method: Literal["first_block"]
    threshold: float = Field(0.05, ge=0, description="largest relative mean absolute "
                             "change of the first block's residual that skips a step")


class TaylorSeer(Section):
    """TaylorSeer (arXiv 2503.06923): compute hooked modules every few steps, predict
    their outputs in between by a Taylor expansion over steps."""
    method: Literal["taylorseer"]
    cache_interval: int = Field(5, ge=1, description="compute every N-th step, predict "
                                "the others")
    disable_cache_before_step: int = Field(3, ge=0, description="steps always computed "
                                           "at the start")
    disable_cache_after_step: int | None = Field(None, ge=0, description="steps always "
                                                 "computed from this one on")
    max_order: int = Field(1, ge=0, description="order of the Taylor expansion")
    taylor_factors_dtype: Dtype = Field("bfloat16", description="dtype of the stored "
                                        "derivatives")
    skip_predict_identifiers: list[str] | None = Field(
        None, description="regexes of modules recomputed on cached steps' place: skipped "
        "(their input passes through)")
    cache_identifiers: list[str] | None = Field(
        None, description="regexes of modules whose outputs are predicted (default: "
        "every block of the transformer's block lists)")
    use_lite_mode: bool = Field(False, description="predict only proj_out; blocks "
                                "skipped on predicted steps")


class GuidanceCache(Section):
    """Porter's guidance cache: on some steps, the unconditional branch is not
    computed; its prediction is the conditional one plus the difference between
    the two at the last step that computed both."""
    method: Literal["guidance"]
    interval: int = Field(2, ge=1, description="inside the window, compute the "
                          "unconditional branch every N-th step (1: every step)")
    start: float = Field(0.2, ge=0, le=1, description="fraction of the steps before "
                         "the window (always both branches)")
    end: float = Field(1.0, ge=0, le=1, description="fraction of the steps where the "
                       "window ends")

METHODS: dict[str, type[Section]] = {
    "magcache": MagCache, "first_block": FirstBlockCache, "taylorseer": TaylorSeer,
    "guidance": GuidanceCache}


def parse(values: dict) -> Section:
    """The method's settings; ``ValueError`` with a ``problems`` list of
    (key, message, hint) where the section is wrong."""
    method = values.get("method")
    if method not in METHODS:
        got = "no method" if method is None else f"unknown method {method!r}"
        raise _Invalid([("method", got, "methods: " + ", ".join(METHODS))])
    model = METHODS[method]
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        found = []
        accepted = ", ".join(k for k in model.model_fields if k != "method")
        for err in exc.errors():
            key = str(err["loc"][0]) if err["loc"] else "method"
            message = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                found.append((key, f"{method} takes no parameter {err['loc'][0]!r}",
                               f"{method} takes: {accepted}"))
            elif err["type"] == "value_error":
                found.append((key, message, None))
            else:
                found.append((key, f"{message} (got {err['input']!r})", None))
        raise _Invalid(found) from None


class _Invalid(ValueError):
    def __init__(self, problems: list):
        super().__init__("; ".join(message for _, message, _ in problems))
        self.problems = problems
