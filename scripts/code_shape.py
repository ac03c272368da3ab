"""The package's shape, for issue-free refactoring: module sizes, the longest functions, and import cycles.

Prints every module over LINES_LIMIT lines and every function over FUNCTION_LIMIT lines, and any cycle among
kbverify's modules (imports at any depth of the module, not only the top). Exit 1 when any limit is broken,
so it can gate a change; `--all` lists every module."""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

LINES_LIMIT = 500
FUNCTION_LIMIT = 60
PACKAGE = Path(__file__).resolve().parents[1] / "kbverify"


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(name: str, tree: ast.AST, known: set[str]) -> set[str]:
    """kbverify modules `name` imports, resolved against the modules that exist."""
    found = set()
    package = name if name in known and modules_is_package(name) else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                if candidate in known:
                    found.add(candidate)
                elif base in known:
                    found.add(base)
    return found - {name}


def modules_is_package(name: str) -> bool:
    return (PACKAGE.parent / Path(*name.split(".")) / "__init__.py").exists()


def long_functions(tree: ast.AST) -> list[tuple[str, int]]:
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > FUNCTION_LIMIT]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="list every module, not only those over the limits")
    args = parser.parse_args()
    found = modules()
    graph, big_modules, long_count = {}, 0, 0
    for name, path in found.items():
        text = path.read_text()
        tree = ast.parse(text)
        graph[name] = imports_of(name, tree, set(found))
        lines = len(text.splitlines())
        long = long_functions(tree)
        big_modules += lines > LINES_LIMIT
        long_count += len(long)
        if args.all or lines > LINES_LIMIT or long:
            detail = ", ".join(f"{function} {length}" for function, length in sorted(long, key=lambda x: -x[1]))
            print(f"{lines:5d}  {name}" + (f"   functions over {FUNCTION_LIMIT}: {detail}" if detail else ""))
    found_cycles = cycles(graph)
    for component in found_cycles:
        print("cycle: " + " -> ".join(component))
    print(f"{len(found)} modules: {big_modules} over {LINES_LIMIT} lines, {long_count} functions over "
          f"{FUNCTION_LIMIT} lines, {len(found_cycles)} import cycles")
    broken = big_modules + long_count + len(found_cycles)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
