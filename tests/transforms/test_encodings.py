"""Text encodings kept (``porter.transforms.encodings``): a port answers its text
encoder from memory for inputs it has encoded before, with the same result, and
says so in each call's record."""

import numpy as np
import pytest
import torch

import porter
from porter.transforms import encodings

from support import RECIPES


@pytest.fixture(scope="module")
def port():
    with porter.load(RECIPES / "wan-tiny.yaml", "generate.steps=2") as loaded:
        yield loaded


def counted(video) -> dict:
    return video.record["timings"]["text_encoding"]


def test_a_prompt_seen_again_skips_the_encoder_and_makes_the_same_video(port):
    first = port.generate("a red fox in the snow", seed=1)
    again = port.generate("a red fox in the snow", seed=1)
    assert counted(first) == {"from_memory": 0, "encoded": 2}  # the prompt, the negative
    assert counted(again) == {"from_memory": 2, "encoded": 0}
    assert np.array_equal(first.frames, again.frames)
    assert torch.equal(first.latents, again.latents)
    # a new prompt: only it is encoded; the empty negative prompt is remembered
    other = port.generate("a boat on a lake", seed=1)
    assert counted(other) == {"from_memory": 1, "encoded": 1}


def test_the_kept_encodings_equal_a_port_without_them(port):
    kept = port.generate("a lighthouse at night", seed=2)
    with porter.load(RECIPES / "wan-tiny.yaml", "generate.steps=2",
                     "runtime.text_cache_mb=0") as plain:
        made = plain.generate("a lighthouse at night", seed=2)
        assert "text_encoding" not in made.record["timings"]
    assert torch.equal(kept.latents, made.latents)


def test_what_a_pipeline_changes_in_place_never_reaches_the_kept_copy():
    kept = encodings.Kept(limit=1 << 20)
    encode = encodings.cached(lambda ids: (ids.float() * 2,), "text_encoder", kept)
    ids = torch.tensor([[1, 2, 3]])
    encode(ids)[0].add_(100)  # the pipeline scales its embeddings in place
    again = encode(ids)
    assert kept.counts() == {"from_memory": 1, "encoded": 1}
    assert again[0].tolist() == [[2.0, 4.0, 6.0]]


def test_the_memory_is_bounded_least_recently_used_out_first():
    kept = encodings.Kept(limit=3 * 4 * 4)  # three outputs of four float32 values
    encode = encodings.cached(lambda ids: ids.float().repeat(1, 4)[:, :4], "te", kept)
    for i in range(4):
        encode(torch.tensor([[i]]))
    encode(torch.tensor([[3]]))  # kept
    encode(torch.tensor([[0]]))  # the oldest: dropped, encoded again
    assert kept.counts() == {"from_memory": 1, "encoded": 5}
    assert kept.held <= kept.limit
    # too large an input (an image) is never keyed
    encode(torch.zeros(1, encodings.MAX_INPUT + 1))
    encode(torch.zeros(1, encodings.MAX_INPUT + 1))
    assert kept.counts()["encoded"] == 7


def test_an_output_larger_than_the_bound_is_encoded_every_time_and_said_once(monkeypatch):
    from porter.runtime import notices

    said = []
    monkeypatch.setattr(notices, "warn", lambda message, *a, **k: said.append(message))
    kept = encodings.Kept(limit=8)  # two float32 values
    encode = encodings.cached(lambda ids: ids.float().repeat(1, 4), "text_encoder", kept)
    for _ in range(3):
        encode(torch.tensor([[1]]))
    assert kept.counts() == {"from_memory": 0, "encoded": 3}
    assert len(said) == 1 and "text_encoder's output" in said[0] and "text_cache_mb" in said[0]


def test_a_text_encoder_the_attention_pass_wrapped_is_kept_too():
    """Components the attention pass leaves to torchax's own attention are wrapped
    (``Skipped``): the module inside is what the pass caches."""
    import types

    from porter.transforms.attention import Skipped

    module = torch.nn.Linear(2, 2)
    b = types.SimpleNamespace(
        recipe=types.SimpleNamespace(runtime=types.SimpleNamespace(text_cache_mb=1)),
        modules={"text_encoder": module},
        pipe=types.SimpleNamespace(text_encoder=Skipped(module)))
    encodings.PASS.apply(b)
    with torch.no_grad():
        b.pipe.text_encoder(torch.ones(1, 2))
        b.pipe.text_encoder(torch.ones(1, 2))
    assert b.encodings.counts() == {"from_memory": 1, "encoded": 1}
