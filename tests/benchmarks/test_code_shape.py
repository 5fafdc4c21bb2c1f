"""benchmarks/code_shape.py's counts, on code written to show each, and on Porter as it
stands."""

import ast
import importlib.util

from support import ROOT

SCRIPT = ROOT / "benchmarks" / "code_shape.py"
spec = importlib.util.spec_from_file_location("code_shape", SCRIPT)
shape = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shape)


def test_each_count_finds_what_it_counts():
    trees = {
        "porter/transforms/x.py": ast.parse(
            "import contextvars\n_v = contextvars.ContextVar('v')\n"
            "PASS = Pass('x', (), '', check=lambda recipe, registry, family: [],\n"
            "            apply=_apply)\n"
            "def _apply(b): pass\ndef f(recipe, registry: object): pass\n"),
        "porter/commands/batch.py": ast.parse(
            "from porter.commands import run as run_mod\nfrom porter.commands.batch import x\n"),
        "porter/commands/serve/jobs.py": ast.parse("from porter.commands import batch\n"),
    }
    assert shape.pass_row_lambdas(trees) == {"porter/transforms/x.py": 1}
    assert shape.context_vars(trees) == ["porter/transforms/x.py:2"]
    assert shape.command_imports(trees) == ["porter.commands.batch -> porter.commands.run",
                                            "porter.commands.serve.jobs -> "
                                            "porter.commands.batch"]
    assert shape.untyped_recipe_parameters(trees) == ["porter/transforms/x.py:6 f"]


def test_commands_are_peers_and_every_recipe_parameter_is_typed():
    """What no other test holds (tests/test_layout.py holds the pass rows' shape,
    tests/runtime/test_trace_context.py the tracing state)."""
    found = shape.shape()
    assert found["command_imports"] == []
    assert found["untyped_recipe_parameters"] == 0
