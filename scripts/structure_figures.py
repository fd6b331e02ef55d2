"""The package's structure in figures, for issue 45's before and after (one engine): lines, modules
over 600 lines, functions over 80, import cycles counting every import (under ``TYPE_CHECKING`` and
inside functions too), function-local and ``TYPE_CHECKING`` imports of the package's own modules,
and ``mypy --strict``'s errors per subpackage.

    .venv/bin/python scripts/structure_figures.py [--no-mypy] [--json]

Reads the source as text (ast); runs nothing of the package. ``mypy --strict`` takes about a minute
on a 2-vCPU machine; ``--no-mypy`` leaves it out. Prints one figure a line (or one JSON object).
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ec2gpu"
MODULE_LINES, FUNCTION_LINES = 600, 80  # ../shared/ARCHITECTURE.md's "never over"


def modules() -> dict[str, Path]:
    """Dotted name under ec2gpu (``runs.execute.engine``; ``""`` for ec2gpu/__init__) -> its file."""
    found = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        parts = p.relative_to(PACKAGE).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return found


def _hidden(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:``."""
    return {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)}


def _local(tree: ast.AST) -> set[int]:
    """ids of the nodes inside a function's body."""
    return {id(n) for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in ast.walk(node) if n is not node}


def imports(name: str, path: Path, mods: dict[str, Path], tree: ast.AST) -> list[tuple[str, ast.AST]]:
    """(target module, import node) of every import of the package's own modules in ``tree``."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            if node.level:
                base = pkg.split(".") if pkg else []
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join([*base, *([node.module] if node.module else [])])
            elif (node.module or "").startswith("ec2gpu"):
                mod = (node.module or "").removeprefix("ec2gpu").lstrip(".")
            else:
                continue
            for a in node.names:
                full = f"{mod}.{a.name}".lstrip(".")
                target = full if full in mods else mod
                if target in mods and target != name:
                    out.append((target, node))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("ec2gpu"):
                    target = a.name.removeprefix("ec2gpu").lstrip(".")
                    if target in mods and target != name:
                        out.append((target, node))
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on, stack, found = set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def figures(with_mypy: bool) -> dict:
    """Every figure this script prints, as one dict."""
    mods = modules()
    lines = {n: len(p.read_text().splitlines()) for n, p in mods.items()}
    long_functions, graph, local, typing_only = [], {n: set() for n in mods}, 0, 0
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        hidden, inside = _hidden(tree), _local(tree)
        for target, node in imports(name, path, mods, tree):
            graph[name].add(target)
            local += id(node) in inside
            typing_only += id(node) in hidden
        for f in ast.walk(tree):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.end_lineno - f.lineno + 1 > FUNCTION_LINES:
                long_functions.append(f"{path.relative_to(ROOT)}:{f.lineno} {f.name} ({f.end_lineno - f.lineno + 1})")
    got = {
        "package_lines": sum(lines.values()), "modules": len(mods),
        "modules_over_600": sorted(f"{mods[n].relative_to(ROOT)} ({c})" for n, c in lines.items() if c > MODULE_LINES),
        "functions_over_80": long_functions,
        "import_cycles": cycles(graph),
        "function_local_imports": local, "type_checking_imports": typing_only,
    }
    if with_mypy:
        done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "ec2gpu"], cwd=ROOT,
                              capture_output=True, text=True)
        errors = [line for line in done.stdout.splitlines() if ": error:" in line]
        got["mypy_strict_errors"] = len(errors)
        got["mypy_strict_errors_by_package"] = dict(Counter(
            re.sub(r"^ec2gpu/([^/:]+).*", r"\1", e).removesuffix(".py") for e in errors).most_common())
    return got


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-mypy", action="store_true", help="leave mypy --strict out (it takes about a minute)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    got = figures(not args.no_mypy)
    if args.json:
        print(json.dumps(got, indent=2))
        return 0
    print(f"package: {got['package_lines']:,} lines in {got['modules']} modules")
    print(f"modules over {MODULE_LINES} lines: {len(got['modules_over_600'])}: {', '.join(got['modules_over_600'])}")
    print(f"functions over {FUNCTION_LINES} lines: {len(got['functions_over_80'])}")
    for row in got["functions_over_80"]:
        print(f"  {row}")
    print(f"import cycles (every import counted): {len(got['import_cycles'])}")
    for c in got["import_cycles"]:
        print(f"  {len(c)} modules: {', '.join(c)}")
    print(f"imports of the package's own modules inside functions: {got['function_local_imports']}; "
          f"under TYPE_CHECKING: {got['type_checking_imports']}")
    if "mypy_strict_errors" in got:
        by = ", ".join(f"{k} {v}" for k, v in got["mypy_strict_errors_by_package"].items())
        print(f"mypy --strict errors: {got['mypy_strict_errors']} ({by})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
