"""The package's layout as the README shows it: packages in layers that only point down,
no import cycle (imports inside functions count: one there would only hide a cycle),
Porter's own modules imported at module level unless a reason is given, tests where
the code they test is, every pass row in one shape.

Imports under ``if TYPE_CHECKING:`` never run: they name the classes a signature takes
(``runtime`` naming ``Recipe``), so the layers here are those of the imports that run. The
cycles count them too: a reader following the names meets them, and a record type that
needs one upward (a pass naming the port that holds its record) is a knot in the design."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "porter"
TESTS = ROOT / "tests"

#: the layers, bottom up: a module imports from its own layer and the ones below it,
#: never from one above (the README's Layout lists them top down)
#: (the registry's names sit low, every pass takes them; the core's own plugin,
#: ``porter.registry.builtin``, found through its entry point, imports what it registers)
LAYERS = ("porter.errors", "porter.shims", "porter.runtime", "porter.recipe",
          "porter.families", "porter.registry", "porter.transforms", "porter.loading",
          "porter.stepcache", "porter.rundir", "porter.generate", "porter.port", "porter.aot",
          "porter.registry.builtin", "porter.api", "porter.commands", "porter.cli", "porter")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def type_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:`` (imports for annotations only)."""
    return {id(sub) for node in ast.walk(tree)
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
            and node.test.id == "TYPE_CHECKING"
            for sub in ast.walk(node) if sub is not node}


def imports(path: Path, modules: set[str], annotations: bool = False):
    """(porter module imported, the import node, inside a function?) for each import of
    Porter's own modules in ``path`` that runs (and with ``annotations``, those for type
    checkers only), wherever in the file it is."""
    tree = ast.parse(path.read_text())
    inner = {id(sub) for node in ast.walk(tree)
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
             for sub in ast.walk(node) if sub is not node}
    skipped = set() if annotations else type_only(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found = set()
        for name in names:
            while name and name not in modules:  # porter.x.y -> porter.x when y is a name
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
        for name in found:
            yield name, node, id(node) in inner


def imported(path: Path, modules: set[str], annotations: bool = False) -> set[str]:
    return {name for name, _, _ in imports(path, modules, annotations)}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or a module importing
    itself (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def layer(module: str) -> int:
    """The index in LAYERS of the longest prefix naming ``module``."""
    return max((i for i, name in enumerate(LAYERS)
                if module == name or module.startswith(name + ".")),
               key=lambda i: len(LAYERS[i]))


def sources() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def test_porter_has_no_import_cycle():
    files = sources()
    modules = set(files)
    # a package's __init__ importing its own submodules is no cycle: Python loads them
    # after the package; a submodule importing its package is
    graph = {name: {target for target in imported(path, modules, annotations=True)
                    if target != name and not (path.name == "__init__.py"
                                               and target.startswith(name + "."))}
             for name, path in files.items()}
    assert cycles(graph) == []


def test_the_detector_finds_a_cycle_through_a_function_level_import(tmp_path):
    (tmp_path / "a.py").write_text("import porter.b\n")
    (tmp_path / "b.py").write_text("def f():\n    from porter import a\n")
    modules = {"porter.a", "porter.b"}
    graph = {"porter.a": imported(tmp_path / "a.py", modules),
             "porter.b": imported(tmp_path / "b.py", modules)}
    assert cycles(graph) == [["porter.a", "porter.b"]]


def test_no_module_imports_from_a_layer_above_its_own():
    files = sources()
    modules = set(files)
    # ``from porter import x`` imports the package ``porter`` too, as every import of a
    # module inside it does: only the module named counts
    upward = [f"{name} -> {target}" + (" (in a function)" if inside else "")
              for name, path in files.items()
              for target, _, inside in imports(path, modules)
              if target != "porter" and layer(target) > layer(name)]
    assert upward == []


def test_imports_for_annotations_only_count_for_cycles_not_layers(tmp_path):
    (tmp_path / "x.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from porter.commands import run\n")
    modules = {"porter.runtime.x", "porter.commands.run"}
    assert list(imports(tmp_path / "x.py", modules)) == []
    assert imported(tmp_path / "x.py", modules, annotations=True) == {"porter.commands.run"}


def test_the_layer_check_finds_an_upward_import(tmp_path):
    (tmp_path / "x.py").write_text("def f():\n    from porter.commands import run\n")
    modules = {"porter.runtime.x", "porter.commands.run"}
    found = [(target, inside) for target, _, inside in imports(tmp_path / "x.py", modules)]
    assert found == [("porter.commands.run", True)]
    assert layer("porter.commands.run") > layer("porter.runtime.x")


def test_every_module_of_porter_is_in_a_layer():
    for name in sources():
        assert any(name == layer_ or name.startswith(layer_ + ".") for layer_ in LAYERS), name


def test_function_level_imports_of_porter_say_why():
    """Porter's own modules are imported at module level; one imported inside a
    function (the CLI imports the subcommand asked for; ``import porter`` imports
    neither JAX nor torch) says why, in a ``# lazy:`` comment on its line or above."""
    files = sources()
    modules = set(files)
    silent = []
    for name, path in files.items():
        lines = path.read_text().splitlines()
        for _, node, inside in imports(path, modules):
            said = " ".join(lines[max(0, node.lineno - 3):node.end_lineno])
            if inside and "# lazy:" not in said:
                silent.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert sorted(set(silent)) == []


def test_the_readme_layout_names_every_package_and_module():
    readme = (ROOT / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("```", 2)[1]
    for path in sorted(PACKAGE.iterdir()):
        if path.name.startswith("_") or path.name == "__pycache__":
            continue
        name = path.name if path.is_dir() else path.stem
        shown = f"{name}/" if path.is_dir() else f"{name}.py"
        assert re.search(rf"(?<![\w/]){re.escape(shown)}", layout), shown
    for module in sorted(PACKAGE.rglob("*.py")):  # each package's modules, by name
        if module.parent != PACKAGE and not module.stem.startswith("__"):
            assert re.search(rf"\b{module.stem}\b", layout), module.relative_to(PACKAGE)


def test_tests_are_where_the_code_they_test_is():
    """A test file of porter's code sits in the folder of its package (tests/<package>/
    test_<module>.py); tests/e2e holds whole runs, tests/<family> a plugin's (named for
    it, not for its package: a folder named porter_wan would stand in for the package),
    tests/benchmarks the benchmark scripts'."""
    packages = {path.name for path in PACKAGE.iterdir() if path.is_dir()
                and path.name != "__pycache__"}
    others = {"e2e", "benchmarks"} | {path.name for path in ROOT.glob("plugins/*")}
    helpers = {"support", "models", "matrix"}
    for test in TESTS.rglob("test_*.py"):
        folder = test.relative_to(TESTS).parts[0]
        if test.parent == TESTS:
            continue  # about porter as a whole: its face, its layout
        assert folder in packages | others | helpers, test.relative_to(ROOT)
        assert folder not in helpers, test.relative_to(ROOT)
    for folder in TESTS.iterdir():
        if folder.is_dir() and folder.name in packages:
            for test in folder.rglob("test_*.py"):  # a package's tests mirror its tree
                below = test.relative_to(folder).parent
                assert (PACKAGE / folder.name / below).is_dir(), test.relative_to(ROOT)


def test_no_test_file_is_over_400_lines():
    long = [f"{path.relative_to(ROOT)}: {n}" for path in TESTS.rglob("test_*.py")
            if (n := len(path.read_text().splitlines())) > 400]
    assert long == []


#: a pass row's parts, each the module's function of this name (``abstract`` may name
#: ``_apply``: the same work on meta models)
PARTS = ("check", "fit", "apply", "abstract", "detail", "around")


def pass_rows() -> dict[str, tuple[ast.Module, ast.Call]]:
    """Each module declaring a pass row (``PASS = Pass(...)``): its tree and the call."""
    found = {}
    for name, path in sources().items():
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in
                                                 node.targets] == ["PASS"] \
                    and isinstance(node.value, ast.Call) \
                    and getattr(node.value.func, "id", None) == "Pass":
                found[name] = (tree, node.value)
    return found


def row_problems(name: str, tree: ast.Module, call: ast.Call) -> list[str]:
    """How one row strays from the shape: a part that is not the module's ``_<part>``
    function (a lambda bridging another signature), or one that takes more than one
    input object."""
    functions = {node.name: node for node in tree.body
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    wrong = []
    for keyword in call.keywords:
        if keyword.arg not in PARTS:
            continue
        allowed = {f"_{keyword.arg}"} | ({"_apply"} if keyword.arg == "abstract" else set())
        value = keyword.value
        if not isinstance(value, ast.Name) or value.id not in allowed:
            wrong.append(f"{name}: {keyword.arg}={ast.unparse(value)}")
        elif value.id not in functions:
            wrong.append(f"{name}: {value.id} is not a function of the module")
        else:
            args = functions[value.id].args
            if len(args.posonlyargs + args.args) != 1 or args.vararg or args.kwonlyargs:
                wrong.append(f"{name}: {value.id} takes more than one input object")
    return wrong


def test_every_pass_row_has_the_same_shape():
    rows = pass_rows()
    assert len(rows) == 13, sorted(rows)
    assert [problem for name, (tree, call) in rows.items()
            for problem in row_problems(name, tree, call)] == []


def test_the_pass_shape_check_finds_a_lambda_a_stray_name_and_two_inputs():
    tree = ast.parse("def _select(b):\n    pass\n\ndef _fit(recipe, modules):\n    pass\n\n"
                     "PASS = Pass('x', (), '', apply=_select, fit=_fit,\n"
                     "            check=lambda recipe, registry, family: [])\n")
    assert row_problems("x", tree, tree.body[-1].value) == [
        "x: apply=_select", "x: _fit takes more than one input object",
        "x: check=lambda recipe, registry, family: []"]
