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
    first, again = Call(long), Call(long)
    prompts.warn_if_cut(_port(), first)  # 9 tokens with the end, 8 read
    said = ("generate.prompt is 9 tokens; the text encoder reads its first 8: the rest "
            "is left out")
    assert first.warnings == [said] and said in notices.given()
    prompts.warn_if_cut(_port(), again)  # printed once a process, recorded every call
    assert again.warnings == [said]
    # what fits, a recipe's own length, a staged family's, no tokenizer, and a tiny
    # model: nothing
    fits = recipe_mod.load(path, ["generate.prompt=" + "word " * 7])
    raised = recipe_mod.load(path, ["generate.prompt=" + "word " * 8,
                                    "generate.max_sequence_length=9"])
    toy = recipe_mod.load(path, ["generate.prompt=" + "word " * 8, "model.source=tiny"])
    staged, bare = _port(SimpleNamespace(text_length=lambda recipe: 64)), _port()
    bare.pipe.tokenizer = None
    for port, recipe in ((_port(), fits), (_port(), raised), (staged, long),
                         (bare, long), (_port(), toy)):
        call = Call(recipe)
        prompts.warn_if_cut(port, call)
        assert call.warnings == []
