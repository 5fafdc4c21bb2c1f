"""A prompt longer than the text encoder reads is said (a warning in the record)."""

from types import SimpleNamespace

from porter import recipe as recipe_mod
from porter.generate import prompts
from porter.generate.call import Call
from porter.runtime import notices

from support import TINY_RECIPE


class _Pipeline:  # a generic pipeline: its call's own default says the length
    def __init__(self):
        self.tokenizer = lambda text: {"input_ids": text.split() + ["</s>"]}

    def __call__(self, prompt=None, max_sequence_length=8):
        raise AssertionError("not called")


def _port(family=None):
    return SimpleNamespace(pipe=_Pipeline(), family=family or SimpleNamespace())


def test_a_prompt_cut_to_the_encoders_length_is_warned_of(write):
    # the pipeline's own length unless the recipe sets one; a model of real size (the
    # tiny ones read a few bytes of their prompts by design: no warning there)
    path = write("r.yaml", TINY_RECIPE.replace("  max_sequence_length: 16\n", "")
                 .replace("source: tiny", "source: org/model"))
    long = recipe_mod.load(path, ["generate.prompt=" + "word " * 8])
    before = len(notices.given())
    prompts.warn_if_cut(_port(), Call(long))  # 9 tokens with the end, 8 read
    assert notices.given()[before:] == [
        "generate.prompt is 9 tokens; the text encoder reads its first 8: the rest is "
        "left out"]
    # what fits, a recipe's own length, a staged family's, and no tokenizer: nothing
    fits = recipe_mod.load(path, ["generate.prompt=" + "word " * 7])
    prompts.warn_if_cut(_port(), Call(fits))
    raised = recipe_mod.load(path, ["generate.prompt=" + "word " * 8,
                                    "generate.max_sequence_length=9"])
    prompts.warn_if_cut(_port(), Call(raised))
    staged = SimpleNamespace(text_length=lambda recipe: 64)
    prompts.warn_if_cut(_port(staged), Call(long))
    bare = _port()
    bare.pipe.tokenizer = None
    prompts.warn_if_cut(bare, Call(long))
    toy = recipe_mod.load(path, ["generate.prompt=" + "word " * 8, "model.source=tiny"])
    prompts.warn_if_cut(_port(), Call(toy))
    assert len(notices.given()) == before + 1
