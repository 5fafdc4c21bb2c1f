"""Failures inside model code are reported at the model's file:line, and called a porting
gap only when torchax, not the library, failed (``porter.shims.tracing.explained``)."""

import importlib.util
import textwrap

import pytest
import torch

from porter.recipe.schema import CompileRule
from porter.shims import fixes as torchax_fixes
from porter.shims.compat import import_torchax
from porter.shims.tracing import PortingError, explained
from porter.transforms import jit

from support.references import Positions

PIPELINE = '''
import torch


def call_with_host_positions(component, x):
    positions = torch.arange(x.shape[0]) * 1.0
    return component(x, positions)


def encode(prompt, negative_prompt=None):
    return len(prompt) + len(negative_prompt)


def call_porter(function):
    return function()
'''


@pytest.fixture
def library(tmp_path):
    """A module of 'model library' code: its file lies in a folder named diffusers."""
    path = tmp_path / "diffusers" / "pipeline_fake.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(PIPELINE))
    spec = importlib.util.spec_from_file_location("fake_pipeline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def line_of(library, text: str) -> int:
    source = open(library.__file__).read().splitlines()
    return next(i for i, line in enumerate(source, 1) if text in line)


def test_a_torchax_failure_beneath_a_compiled_call_points_at_the_model_line(
        library, monkeypatch):
    env = import_torchax().default_env()
    monkeypatch.setattr(torchax_fixes, "on_device", lambda tree: tree)  # the gap, back
    with env:
        component = jit.apply(Positions().to("jax"),
                                            CompileRule(methods=["forward"]))
        with pytest.raises(PortingError) as caught, explained():
            library.call_with_host_positions(component, torch.ones(3, device="jax"))
    line = line_of(library, "return component(x, positions)")
    assert f"diffusers/pipeline_fake.py:{line} (call_with_host_positions)" \
        in caught.value.message
    assert "porting gap" in caught.value.hint


def test_the_librarys_own_failure_is_not_called_a_porting_gap(library):
    with pytest.raises(PortingError) as caught, explained():
        library.encode("a cat")  # the pipeline's default None fails in plain diffusers too
    line = line_of(library, "return len(prompt) + len(negative_prompt)")
    assert f"diffusers/pipeline_fake.py:{line} (encode)" in caught.value.message
    assert "porting gap" not in caught.value.hint
    assert "plain diffusers too" in caught.value.hint


def test_porters_own_failure_under_model_code_stays_an_internal_error(library):
    def backend():  # a Porter function the model calls (as an attention backend is)
        raise ZeroDivisionError("a bug")

    backend.__code__ = backend.__code__.replace(co_filename="/x/porter/transforms/kernel.py")
    with pytest.raises(ZeroDivisionError), explained():
        library.call_porter(backend)


def test_a_bug_in_porters_compile_wrappers_stays_an_internal_error(library):
    """The wrappers that carry a call into a compiled program are passed over only when
    torchax or JAX raised beneath them; what they raise themselves is Porter's."""
    def wrapper():
        raise KeyError("a bug in the wrapper")

    wrapper.__code__ = wrapper.__code__.replace(
        co_filename="/x/porter/transforms/jit/autosplit.py")
    with pytest.raises(KeyError), explained():
        library.call_porter(wrapper)
