"""Every piece of state that changes tracing is declared in one place
(``porter.runtime.trace_context``), says whether it keys a compiled program, and the
compile pass and the trace cache key their programs by it."""

import ast
from pathlib import Path

from porter.runtime import trace_context
from porter.runtime.trace_context import (
    ATTENTION_OFF,
    ATTENTION_REPEATS,
    ATTENTION_TALLY,
    VIDEO_GRID,
)

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "porter" / "runtime" / "trace_context.py"


def context_vars(path: Path) -> list[int]:
    """Lines of ``path`` that make a ``ContextVar`` (``ContextVar(...)`` or
    ``contextvars.ContextVar(...)``)."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and (getattr(node.func, "id", None) == "ContextVar"
                                               or getattr(node.func, "attr", None)
                                               == "ContextVar")]


def test_no_context_var_lives_outside_the_trace_context():
    """State read while tracing, kept anywhere else, would change programs without
    keying them: every ``ContextVar`` of Porter and its plugins is declared there."""
    found = [f"{path.relative_to(ROOT)}:{line}"
             for folder in ("porter", "plugins") for path in (ROOT / folder).rglob("*.py")
             if path != HOME for line in context_vars(path)]
    assert found == []
    assert context_vars(HOME)  # the walk sees the ones it keeps


def test_the_walk_finds_a_context_var_however_it_is_imported(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import contextvars\nfrom contextvars import ContextVar\n"
                    "a = contextvars.ContextVar('a')\nb = ContextVar('b', default=1)\n")
    assert context_vars(path) == [3, 4]


def test_the_key_holds_the_states_that_key_programs():
    """Two grids of one token count (480x832 and 832x480) key two programs, as does
    attention left to torchax; counting FLOPs keys nothing; outside every block,
    nothing."""
    assert trace_context.key() == () and trace_context.label(()) == ""
    with VIDEO_GRID.set((21, 30, 52)):
        wide = trace_context.key()
        assert wide == (("video_grid", (21, 30, 52)),)
        with ATTENTION_OFF.set(True):
            assert trace_context.key() == (("attention_off", True),
                                           ("video_grid", (21, 30, 52)))
            assert trace_context.label(trace_context.key()) == \
                "@attention_off=True,video_grid=21x30x52"
    with VIDEO_GRID.set((21, 52, 30)):
        assert trace_context.key() != wide
    with ATTENTION_TALLY.set([]), ATTENTION_REPEATS.set(3):
        assert trace_context.key() == ()
    assert trace_context.key() == ()  # every block undone


def test_the_compile_pass_and_the_trace_cache_key_by_it(tmp_path):
    """A program traced under another key is another program, in memory and on disk."""
    from porter.transforms.jit import autosplit
    from porter.transforms.jit.traces import TraceCache

    program = autosplit.programs(lambda x: x, "transformer.forward",
                                 autosplit.Split("transformer"))
    plain = program(())
    with VIDEO_GRID.set((3, 4, 5)):
        windowed = program(())
        assert program(()) is windowed
    assert windowed is not plain and program(()) is plain
    cache = TraceCache(tmp_path, "fingerprint")
    outside = cache.key("transformer.forward", {}, (), {})
    with ATTENTION_OFF.set(True):
        assert cache.key("transformer.forward", {}, (), {}) != outside
