"""A prompt longer than the text encoder reads is said, not cut silently: diffusers'
video pipelines tokenize with ``truncation=True`` at ``max_sequence_length`` and most
say nothing of what they left out."""

from __future__ import annotations

from typing import TYPE_CHECKING

from porter.recipe import call_args
from porter.runtime import notices

if TYPE_CHECKING:
    from porter.generate.call import Call
    from porter.recipe import Recipe


def text_length(port, recipe: Recipe) -> int | None:
    """The tokens a prompt is cut to: a staged family's, the recipe's, or the
    pipeline call's own default (None where the pipeline takes no such setting)."""
    if hasattr(port.family, "text_length"):
        return port.family.text_length(recipe)
    if recipe.sets("generate.max_sequence_length"):
        return recipe.generate.max_sequence_length
    taken = (call_args.parameters(type(port.pipe)) or {}).get("max_sequence_length")
    default = getattr(taken, "default", None)
    return default if isinstance(default, int) else None


def warn_if_cut(port, call: Call) -> None:
    """A warning (in the run's record) for each prompt of ``call`` with more tokens
    than the pipeline's first tokenizer passes on to its encoder."""
    if call.recipe.model.source == "tiny":  # a byte-level toy reading 16-32 bytes: by design
        return
    tokenizer = getattr(port.pipe, "tokenizer", None)
    length = text_length(port, call.recipe)
    if tokenizer is None or length is None:
        return
    for key in ("prompt", "negative_prompt"):
        text = getattr(call.recipe.generate, key, None)
        if not isinstance(text, str) or not text:
            continue
        count = len(tokenizer(text)["input_ids"])
        if count > length:
            said = (f"generate.{key} is {count} tokens; the text encoder reads its first "
                    f"{length}: the rest is left out")
            call.warnings.append(said)  # each call's record, where notices says it once
            notices.warn(said, hint="shorten it, or raise generate.max_sequence_length "
                                    "where the model takes more")
