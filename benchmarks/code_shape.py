"""The shape of Porter's code, counted by an AST walk: what the pass table leaves to
lambdas, the state that changes tracing outside its declared home, commands importing
each other, untyped ``recipe`` parameters, the longest module and function.

    python benchmarks/code_shape.py [--json]

Every figure is read from the source as it stands (nothing is imported or run), so a
change's before and after are two runs of this script.
"""

import argparse
import ast
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "porter"
#: the one module where state that changes what is traced may live
TRACE_STATE = "porter/runtime/trace_context.py"


def modules(root: Path = PACKAGE) -> dict[str, ast.Module]:
    return {str(path.relative_to(ROOT)): ast.parse(path.read_text())
            for path in sorted(root.rglob("*.py"))}


def dotted(path: str) -> str:
    parts = list(Path(path).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _calls_named(tree: ast.AST, name: str):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called == name:
                yield node


def pass_row_lambdas(trees: dict) -> dict[str, int]:
    """Lambdas inside each module's ``Pass(...)`` row."""
    found = {}
    for path, tree in trees.items():
        for call in _calls_named(tree, "Pass"):
            count = sum(isinstance(n, ast.Lambda) for n in ast.walk(call))
            if count:
                found[path] = found.get(path, 0) + count
    return found


def context_vars(trees: dict) -> list[str]:
    """``ContextVar``s made outside ``TRACE_STATE`` (module:line)."""
    return [f"{path}:{call.lineno}" for path, tree in trees.items() if path != TRACE_STATE
            for call in _calls_named(tree, "ContextVar")]


def command_imports(trees: dict) -> list[str]:
    """Imports from one command's module (``porter.commands.<command>``) of another
    command's."""
    def command(name: str) -> str | None:
        parts = name.split(".")
        return parts[2] if len(parts) > 2 and parts[:2] == ["porter", "commands"] else None

    found = []
    for path, tree in trees.items():
        mine = command(dotted(path))
        if mine is None:
            continue
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                other = command(name)
                if other is not None and other != mine:
                    found.append(f"{dotted(path)} -> porter.commands.{other}")
    return sorted(set(found))


def untyped_recipe_parameters(trees: dict) -> list[str]:
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                for arg in args.posonlyargs + args.args + args.kwonlyargs:
                    if arg.arg == "recipe" and arg.annotation is None:
                        found.append(f"{path}:{node.lineno} {node.name}")
    return found


def longest(trees: dict) -> dict:
    lines = {path: len((ROOT / path).read_text().splitlines()) for path in trees}
    module = max(lines, key=lines.get)
    functions = [(node.end_lineno - node.lineno + 1, f"{path}:{node.lineno} {node.name}")
                 for path, tree in trees.items() for node in ast.walk(tree)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    size, where = max(functions)
    return {"module": {"path": module, "lines": lines[module]},
            "function": {"where": where, "lines": size}}


def shape() -> dict:
    trees = modules()
    lambdas = pass_row_lambdas(trees)
    return {"pass_row_lambdas": sum(lambdas.values()), "pass_row_lambdas_by_module": lambdas,
            "undeclared_context_vars": context_vars(trees),
            "command_imports": command_imports(trees),
            "untyped_recipe_parameters": len(untyped_recipe_parameters(trees)),
            "longest": longest(trees)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    found = shape()
    if parser.parse_args().json:
        print(json.dumps(found, indent=2))
        return
    print(f"lambdas in pass rows:        {found['pass_row_lambdas']}  "
          f"{found['pass_row_lambdas_by_module']}")
    print(f"undeclared tracing state:    {len(found['undeclared_context_vars'])}  "
          f"{found['undeclared_context_vars']}")
    print(f"imports between commands:    {len(found['command_imports'])}  "
          f"{found['command_imports']}")
    print(f"untyped recipe parameters:   {found['untyped_recipe_parameters']}")
    print(f"longest module:              {found['longest']['module']}")
    print(f"longest function:            {found['longest']['function']}")


if __name__ == "__main__":
    main()
