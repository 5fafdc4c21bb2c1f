"""The package's layout as the README shows it, and no import cycle in it (imports inside
functions count: one there would only hide a cycle)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "porter"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path, modules: set[str]) -> set[str]:
    """The porter modules ``path`` imports, wherever in the file the import is."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:  # porter.x.y -> porter.x when y is a name
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


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


def test_porter_has_no_import_cycle():
    files = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    modules = set(files)
    # a package's __init__ importing its own submodules is no cycle: Python loads them
    # after the package; a submodule importing its package is
    graph = {name: {target for target in imported(path, modules) if target != name
                    and not (path.name == "__init__.py" and target.startswith(name + "."))}
             for name, path in files.items()}
    assert cycles(graph) == []


def test_the_detector_finds_a_cycle_through_a_function_level_import(tmp_path):
    (tmp_path / "a.py").write_text("import porter.b\n")
    (tmp_path / "b.py").write_text("def f():\n    from porter import a\n")
    modules = {"porter.a", "porter.b"}
    graph = {"porter.a": imported(tmp_path / "a.py", modules),
             "porter.b": imported(tmp_path / "b.py", modules)}
    assert cycles(graph) == [["porter.a", "porter.b"]]


def test_the_readme_layout_names_every_module_and_package():
    readme = (ROOT / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("```", 2)[1]
    for path in sorted(PACKAGE.iterdir()):
        if path.name.startswith("_") or path.name == "__pycache__":
            continue
        name = path.name if path.is_dir() else path.stem
        shown = f"{name}/" if path.is_dir() else f"{name}.py"
        assert re.search(rf"(?<![\w/]){re.escape(shown)}", layout), shown
    for module in sorted(PACKAGE.glob("*/*.py")):  # each package's modules, by name
        if module.stem != "__init__":
            assert re.search(rf"\b{module.stem}\b", layout), module.relative_to(PACKAGE)
